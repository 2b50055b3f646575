"""What a pod's daemon runs with: its environment and its command line."""

from __future__ import annotations

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
# Inside the pod, under names of no host path: the daemon's own package (``services/__init__.py``
# and ``services/envd``) and its bytecode cache (see .bytecode). The daemon imports its package
# from there: :func:`bootstrap` puts DAEMON_CODE first on its module path.
DAEMON_DIR = "/run/torpor-daemon"
DAEMON_CODE = f"{DAEMON_DIR}/code"
DAEMON_PYCACHE = f"{DAEMON_DIR}/pycache"
# The daemon's interpreter, standard library and packages (see .daemon_python).
DAEMON_PY = f"{DAEMON_DIR}/py"
# A template's own command gets this as ``{python}``: the daemon's interpreter, by which
# ``{python} -m services.envd`` finds the daemon's package (see :func:`python_shim`).
PYTHON_SHIM = f"{DAEMON_DIR}/python"


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
    template: Template, record: WorkloadRecord, *, python: str, pycache: str = DAEMON_PYCACHE
) -> list[str]:
    """The pod's command: the template's, or the in-sandbox daemon on the pod's address."""
    if template.command is not None:
        values = {
            "python": PYTHON_SHIM,
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


def _python_module(python: str, pycache: str, module: str) -> list[str]:
    return [python, *daemon_flags(pycache), *bootstrap(module)]


def daemon_flags(pycache: str) -> list[str]:
    """``-I``: the daemon imports nothing a sandbox can plant or name: not the working folder
    (``-c`` puts it first on the module path), no ``PYTHON*`` variable of the template's
    environment, no user site folder under a HOME the sandbox writes. Its bytecode comes from
    ``pycache`` (see .bytecode)."""
    return ["-I", "-X", f"pycache_prefix={pycache}"]


def bootstrap(module: str, code: str = DAEMON_CODE) -> list[str]:
    """``python -m module`` with ``code`` first on the module path: what ``-m`` does (the same
    ``sys.argv`` and ``__main__``), without an environment variable the daemon would hand on
    to the sandbox's processes, and without the host path an installed checkout's ``.pth``
    names."""
    script = (
        f"import runpy, sys; sys.path.insert(0, {code!r}); "
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)"
    )
    return ["-c", script]


def python_shim(python: str, pycache: str = DAEMON_PYCACHE) -> str:
    """The script at :data:`PYTHON_SHIM`: ``-m MODULE ARGS`` runs as the pod's daemon is run
    (:func:`bootstrap`, its bytecode cache), anything else is the interpreter's own."""
    script = (
        f"import runpy, sys; sys.path.insert(0, {DAEMON_CODE!r}); m = sys.argv.pop(1); "
        "runpy.run_module(m, run_name='__main__', alter_sys=True)"
    )
    return (
        "#!/bin/sh\n"
        'if [ "$1" = -m ] && [ $# -ge 2 ]; then\n'
        f"  m=$2; shift 2; exec {_quote(python)} {' '.join(map(_quote, daemon_flags(pycache)))} -c "
        f'{_quote(script)} "$m" "$@"\n'
        "fi\n"
        f'exec {_quote(python)} "$@"\n'
    )


def _quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"
