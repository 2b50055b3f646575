"""``shared.envd.client.ConnectEnvdClient`` against the daemon, cross-checked with the SDK."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
from e2b import Sandbox

from shared.envd.client import ConnectEnvdClient
from shared.errors import EnvdError, EnvdUnavailable
from shared.models.snapshots import ProcessConfig
from shared.ports.envd import CommandResult
from shared.ports.workloads import Endpoint
from tests.envd.conftest import TOKEN, Daemon, free_port


@pytest.fixture
async def client() -> AsyncIterator[ConnectEnvdClient]:
    c = ConnectEnvdClient()
    yield c
    await c.close()


def _endpoint(daemon: Daemon) -> Endpoint:
    return Endpoint(host="127.0.0.1", port=daemon.port, pod_uid="test")


async def test_seed_command_shows_up_in_list_processes(
    sbx: Sandbox, daemon: Daemon, client: ConnectEnvdClient
) -> None:
    cmd = (
        "PYTHONPATH=/workspace/pylibs PATH=/workspace/npm/bin:$PATH "
        "python3 server.py > service.log 2>&1"
    )
    (daemon.root / "server.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(60)\n")
    handle = sbx.commands.run(cmd, background=True, timeout=0, cwd=str(daemon.root))
    pid = handle.pid
    del handle  # as in the seed: the stream closes, the process stays
    processes = await client.list_processes(_endpoint(daemon), access_token=TOKEN)
    mine = [p for p in processes if p.pid == pid]
    assert len(mine) == 1
    assert mine[0].config.cmd == "/bin/bash"
    assert mine[0].config.args == ["-l", "-c", cmd]
    assert mine[0].config.cwd == str(daemon.root)
    deadline = time.monotonic() + 10
    log = daemon.root / "service.log"
    while not log.exists() or "up" not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, "server.py did not run"
        time.sleep(0.05)
    assert sbx.commands.kill(pid)


async def test_start_process_shows_up_in_sdk_list(
    sbx: Sandbox, daemon: Daemon, client: ConnectEnvdClient
) -> None:
    config = ProcessConfig(
        cmd="/bin/bash",
        args=["-l", "-c", "echo $X > started.txt; sleep 60"],
        cwd=str(daemon.root),
        envs={"X": "replayed"},
    )
    pid = await client.start_process(_endpoint(daemon), config, tag="svc", access_token=TOKEN)
    listed = {p.pid: p for p in sbx.commands.list()}
    assert pid in listed
    assert listed[pid].tag == "svc"
    assert listed[pid].args == config.args
    assert listed[pid].envs == {"X": "replayed"}
    # The shell creates the file (the redirection) before echo writes it: wait for the line.
    started = daemon.root / "started.txt"
    deadline = time.monotonic() + 10
    while not (started.exists() and started.read_text().endswith("\n")):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert started.read_text() == "replayed\n"
    # Start order: the client's List reports oldest first.
    processes = await client.list_processes(_endpoint(daemon), access_token=TOKEN)
    assert processes[-1].pid == pid
    assert processes[-1].tag == "svc"
    assert sbx.commands.kill(pid)


async def test_client_errors(daemon: Daemon, client: ConnectEnvdClient) -> None:
    endpoint = _endpoint(daemon)
    assert await client.health(endpoint) is True
    with pytest.raises(EnvdError) as info:
        await client.list_processes(endpoint, access_token="wrong")
    assert info.value.code == "unauthenticated"
    bad = ProcessConfig(cmd="/no/such/binary", args=[])
    with pytest.raises(EnvdError) as info:
        await client.start_process(endpoint, bad, tag=None, access_token=TOKEN)
    assert info.value.code == "invalid_argument"
    nowhere = Endpoint(host="127.0.0.1", port=free_port(), pod_uid="gone")
    assert await client.health(nowhere) is False
    with pytest.raises(EnvdUnavailable):
        await client.list_processes(nowhere, access_token=TOKEN, timeout=2)
    with pytest.raises(EnvdUnavailable):
        await client.start_process(nowhere, bad, tag=None, access_token=TOKEN, timeout=2)


async def test_async_sdk_watch_dir_stream(daemon: Daemon, sdk_opts: dict[str, str]) -> None:
    """``AsyncSandbox.files.watch_dir`` uses the WatchDir server stream (the sync SDK polls)."""
    import asyncio

    from e2b import AsyncSandbox, FilesystemEvent

    sbx = await AsyncSandbox.connect("sbx-async", **sdk_opts)
    (daemon.root / "streamed").mkdir()
    seen: list[FilesystemEvent] = []
    handle = await sbx.files.watch_dir("streamed", on_event=seen.append)
    await sbx.files.write("streamed/a.txt", "1")
    for _ in range(100):
        if any(e.name == "a.txt" for e in seen):
            break
        await asyncio.sleep(0.05)
    await handle.stop()
    assert any(e.name == "a.txt" and e.type.name == "CREATE" for e in seen)


def test_daemon_reaps_children_and_imports_no_control_plane(sbx: Sandbox, daemon: Daemon) -> None:
    import subprocess
    import sys
    from pathlib import Path

    from e2b import CommandExitException

    for code in (0, 1, 0, 1):
        try:
            sbx.commands.run(f"exit {code}")
        except CommandExitException:
            assert code == 1
    sbx.commands.run("true & true & wait")
    children = Path(f"/proc/{daemon.proc.pid}/task/{daemon.proc.pid}/children").read_text().split()
    states = [
        Path(f"/proc/{c}/stat").read_text().split(") ")[1][0]
        for c in children
        if Path(f"/proc/{c}/stat").exists()
    ]
    assert "Z" not in states, f"zombie children: {children} {states}"
    probe = (
        "import sys, services.envd.server; "
        "bad = [m for m in sys.modules if m == 'shared' or m.startswith('shared.')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", probe], check=True, cwd=Path(__file__).parents[2])


async def test_run_command_reports_exit_code_output_and_timeout(
    daemon: Daemon, client: ConnectEnvdClient
) -> None:
    """What the lifecycle hooks run on: to the end, with the output's tail; killed at timeout."""
    import getpass

    me = getpass.getuser()

    async def run(command: str, timeout: float = 10, token: str = TOKEN) -> CommandResult:
        return await client.run_command(
            _endpoint(daemon), command, user=me, timeout=timeout, access_token=token
        )

    done = await run("echo out; echo err >&2; exit 3")
    assert done.exit_code == 3 and not done.timed_out
    assert sorted(done.output.split()) == ["err", "out"]
    ok = await run("head -c 20000 /dev/zero | tr '\\0' x")
    assert ok.exit_code == 0 and ok.output == "x" * 8192  # the tail only
    slow = await run("echo begun; sleep 30", timeout=1)
    assert slow.timed_out and slow.exit_code is None and "begun" in slow.output
    with pytest.raises(EnvdError):
        await run("true", timeout=5, token="wrong")


async def test_activity_needs_the_token_and_reports_output(
    sbx: Sandbox, daemon: Daemon, client: ConnectEnvdClient
) -> None:
    before = await client.activity(_endpoint(daemon), access_token=TOKEN)
    assert set(before.last) == {"cpu", "output", "connections", "keepalive"}
    sbx.commands.run("echo some output")
    after = await client.activity(_endpoint(daemon), access_token=TOKEN)
    assert after.last["output"] is not None and after.last["output"] <= after.now
    with pytest.raises(EnvdError):
        await client.activity(_endpoint(daemon), access_token=None)
