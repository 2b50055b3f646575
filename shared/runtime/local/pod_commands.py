"""What a pod's daemon runs with: its environment and its command line."""

from __future__ import annotations

from pathlib import Path

from shared.ports.workloads import ENVD_PORT
from shared.runtime.local.records import WorkloadRecord
from shared.runtime.templates import Template

ENV_ACCESS_TOKEN = "ENVD_ACCESS_TOKEN"  # noqa: S105 - a variable name, read by the daemon
# A built template's start and ready commands (services/envd/startup.py reads them).
ENV_START_CMD = "TORPOR_START_CMD"
ENV_READY_CMD = "TORPOR_READY_CMD"
ENV_START_USER = "TORPOR_START_USER"
ENV_START_CWD = "TORPOR_START_CWD"
# Inside the pod: where the daemon serves `sudo` (deploy/sandbox-base/sudo, services/envd/sudo.py).
SUDO_SOCKET = "/run/torpor/sudo.sock"


def pod_env(template: Template, record: WorkloadRecord) -> dict[str, str]:
    """The environment of the pod of ``record``: the sandbox's, and what its daemon reads."""
    # The rootfs's own programs (its python3, pip, node); the daemon's interpreter is
    # started by path and stays out of the sandbox's PATH.
    env = {
        "PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        **template.env,
        **record.envs,
        "E2B_SANDBOX": "true",
        "E2B_SANDBOX_ID": record.name,
    }
    # The daemon reads these once and keeps them from the processes it starts.
    for var, value in (
        (ENV_START_CMD, template.start_cmd),
        (ENV_READY_CMD, template.ready_cmd),
        (ENV_START_USER, template.user if template.start_cmd or template.ready_cmd else None),
        (ENV_START_CWD, template.start_cwd),
    ):
        if value:
            env[var] = value
    if record.access_token:
        # Not ``--access-token`` in argv: visible in ``ps``, and a token starting with "-"
        # would be read as an option. The daemon drops it from the environment it hands on.
        env[ENV_ACCESS_TOKEN] = record.access_token
    return env


def pod_command(
    template: Template, record: WorkloadRecord, *, python: str, pycache: Path
) -> list[str]:
    """The pod's command: the template's, or the in-sandbox daemon on the pod's address."""
    if template.command is not None:
        values = {
            "python": python,
            "host": record.address,
            "port": str(ENVD_PORT),
            "root": "/workspace",
        }
        # Through the entry step: the template's command (sandbox code, no daemon to do it)
        # starts in the out-of-reach domain, then runs with its own argv, env and cwd.
        return [
            *_python_module(python, pycache, "services.envd.reach"),
            "--",
            *(part.format(**values) for part in template.command),
        ]
    return [
        *_python_module(python, pycache, "services.envd"),
        "--listen",
        f"{record.address}:{ENVD_PORT}",
        "--root",
        "/home/user",
        "--sudo-socket",
        SUDO_SOCKET,
    ]


def _python_module(python: str, pycache: Path, module: str) -> list[str]:
    return [python, "-X", f"pycache_prefix={pycache}", "-m", module]
