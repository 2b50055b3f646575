"""Helpers for the pod hardening tests: small templates written into a stack, SDK options, and
the host's view of a sandbox's pod (its processes, their host uids, its cgroups)."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

from e2b import CommandExitException, Sandbox

from shared.runtime.local import limits, procfs
from tests.support.stack import Stack

# Small limits, so an attack hits them in a second instead of exhausting the shared machine.
SMALL = "podhard-small"
SMALL_TEMPLATE = """\
name: podhard-small
workdir: /workspace
env:
  LANG: C.UTF-8
  HOME: /workspace
resources:
  limits:
    memory: 256Mi
    cpu: "1"
    pids: 64
    nofile: 1024
    disk: 64Mi
"""
DISK_LIMIT = 64 * 2**20
PIDS_LIMIT = 64


def install_templates(stack: Stack) -> None:
    (stack.templates_dir / f"{SMALL}.yaml").write_text(SMALL_TEMPLATE)


def create(stack: Stack, template: str = "sandbox-base", user: str = "alice") -> Sandbox:
    return Sandbox.create(template=template, timeout=300, **stack.sdk_opts(user))


def run(sbx: Sandbox, cmd: str, timeout: float = 60, user: str | None = None) -> tuple[int, str]:
    """(exit code, stdout+stderr) of a shell command in the sandbox (as E2B's default `user`,
    or ``user``); never raises on exit."""
    try:
        done = sbx.commands.run(cmd, timeout=timeout, user=user)  # type: ignore[arg-type]
    except CommandExitException as e:
        return e.exit_code, e.stdout + e.stderr
    return done.exit_code, done.stdout + done.stderr


def pod_of(stack: Stack, sandbox_id: str) -> procfs.FoundPod:
    [pod] = [p for p in procfs.scan_pods(stack.data_dir) if p.workload == sandbox_id]
    return pod


def pod_pids(stack: Stack, sandbox_id: str) -> list[int]:
    """The outer bwrap and every process below it."""
    pod = pod_of(stack, sandbox_id)
    return [pod.pid, *procfs.descendants(pod.pid)]


def host_uids(pid: int) -> list[int]:
    """Real, effective, saved and filesystem uid of a process, as the host sees them."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Uid:"):
            return [int(x) for x in line.split()[1:]]
    msg = f"no Uid line for {pid}"
    raise AssertionError(msg)


def cgroups(stack: Stack) -> limits.Cgroups | None:
    return limits.Cgroups.detect(limits.instance_name(stack.data_dir.resolve()))


def no_pod_left(stack: Stack, pod_uid: str) -> list[str]:
    """What is left on the host of pod ``pod_uid`` (empty when it is entirely gone)."""
    left = []
    if any(p.uid == pod_uid for p in procfs.scan_pods(stack.data_dir)):
        left.append("bwrap processes")
    groups = cgroups(stack)
    if groups is not None and groups.procs(pod_uid):
        left.append(f"processes in its cgroups: {sorted(groups.procs(pod_uid))}")
    if groups is not None and any(f.exists() for f in groups.folders(pod_uid)):
        left.append("cgroup folders")
    if (stack.data_dir / "pods" / pod_uid).exists():
        left.append("pod folder")
    return left


def canary_token() -> str:
    return f"canary-{uuid.uuid4().hex}"


def alive(pid: int, started: int | None) -> bool:
    return started is not None and procfs.start_ticks(pid) == started


def on_ci() -> bool:
    return os.environ.get("CI", "").lower() == "true"
