"""The runtime acts only on what it created: processes inside a sandbox that pose as pods (a
``bwrap`` command line with TORPOR_* marks naming the real data dir, another tenant's pod, or a
canary folder) are never signalled, adopted or cleaned up, not by the start-up stray sweep of a
second runtime, nor when the sandbox whose pod uid they claim is killed. And a killed sandbox's
pod is entirely gone afterwards, even when its processes ignore SIGTERM and keep forking."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest

from shared.runtime.local import LocalRuntime, bwrap, procfs
from tests.security.pod_support import create, no_pod_left, pod_of, run
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

# Inside the sandbox: a process whose command line is argv[0] "bwrap" followed by marks; it
# just sleeps (bash's ``exec -a`` sets argv[0]; python ignores arguments after ``-c CODE``).
FORGE = "nohup bash -c 'exec -a bwrap python3 -c \"import time; time.sleep(600)\" {args}' >/dev/null 2>&1 &"


def _forge(marks: dict[str, str]) -> str:
    args = " ".join(f"--setenv {k} {v}" for k, v in marks.items())
    return FORGE.format(args=f"--unshare-pid {args} -- sleep")


def _forged_pids(token: str) -> dict[int, int | None]:
    """pid -> start time of every host process whose command line holds ``token``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if token.encode() in cmdline and cmdline.startswith(b"bwrap\0"):
            found[int(entry.name)] = procfs.start_ticks(int(entry.name))
    return found


async def test_forged_pods_inside_a_sandbox_are_never_touched(stack: Stack, tmp_path: Path) -> None:
    attacker, victim = create(stack), create(stack, user="bob")
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep.txt").write_text("keep")
    data = stack.data_dir.resolve()
    victim_pod = pod_of(stack, victim.sandbox_id)
    token = uuid.uuid4().hex
    forgeries = [
        # Another tenant's real pod: killing the victim must not kill these.
        {"TORPOR_POD_UID": victim_pod.uid, "TORPOR_WORKLOAD": victim.sandbox_id,
         "TORPOR_RUNTIME_ID": bwrap.runtime_id(data), "TORPOR_X": token},
        # A pod no record knows: the stray sweep must not "stop" it.
        {"TORPOR_POD_UID": str(uuid.uuid4()), "TORPOR_WORKLOAD": "ghost",
         "TORPOR_RUNTIME_ID": bwrap.runtime_id(data), "TORPOR_X": token},
        # Marks pointing at a canary folder, with a path for a uid.
        {"TORPOR_POD_UID": "../../canary", "TORPOR_WORKLOAD": "x",
         "TORPOR_RUNTIME_ID": bwrap.runtime_id(canary), "TORPOR_X": token},
    ]  # fmt: skip
    try:
        for marks in forgeries:
            code, out = run(attacker, _forge(marks))
            assert code == 0, out
        deadline = time.monotonic() + 10
        while len(forged := _forged_pids(token)) < len(forgeries):
            assert time.monotonic() < deadline, f"forged processes did not start: {forged}"
            time.sleep(0.1)

        # Not recognised as pods, whatever their command line says.
        found = {p.uid for p in procfs.scan_pods(data)}
        assert found >= {victim_pod.uid}
        assert not {str(m["TORPOR_POD_UID"]) for m in forgeries[1:]} & found
        assert all(p.pid not in forged for p in procfs.scan_pods(data))

        # A second runtime on the same records and data dir: its start-up stray sweep.
        sweeper = LocalRuntime(
            nats_url=stack.nats_url,
            data_dir=data,
            templates_dir=stack.templates_dir,
            stop_pods_on_close=False,
            poll_interval=0.2,
        )
        await sweeper.start()
        await sweeper.close()

        # Killing the victim stops the victim's pod, and nothing else.
        assert victim.kill() is True
        deadline = time.monotonic() + 30
        while left := no_pod_left(stack, victim_pod.uid):
            assert time.monotonic() < deadline, f"the killed sandbox's pod is still there: {left}"
            time.sleep(0.2)

        assert _forged_pids(token) == forged, "a forgery was hit"
        assert (canary / "keep.txt").read_text() == "keep"
        code, out = run(attacker, "echo alive")
        assert (code, out.strip()) == (0, "alive")
    finally:
        attacker.kill()
        victim.kill()
    # The forgeries lived in the attacker's sandbox and went with it.
    deadline = time.monotonic() + 30
    while _forged_pids(token):
        assert time.monotonic() < deadline, "forged processes outlived their sandbox"
        time.sleep(0.2)


def test_killed_sandbox_leaves_nothing_even_when_it_resists(stack: Stack) -> None:
    sbx = create(stack)
    pod = pod_of(stack, sbx.sandbox_id)
    resist = (
        'nohup bash -c \'trap "" TERM HUP; while true; do (trap "" TERM; sleep 30) & sleep 0.2;'
        " done' >/dev/null 2>&1 &"
    )
    assert run(sbx, resist)[0] == 0
    assert run(sbx, "setsid nohup sleep 600 >/dev/null 2>&1 &")[0] == 0
    time.sleep(1)
    assert sbx.kill() is True
    deadline = time.monotonic() + 30
    while left := no_pod_left(stack, pod.uid):
        assert time.monotonic() < deadline, f"the killed sandbox's pod is still there: {left}"
        time.sleep(0.2)
    other = create(stack)
    try:
        assert run(other, "echo ok")[1].strip() == "ok"
    finally:
        other.kill()
