"""``torpor up`` as a real process: NATS plus every service, ``torpor env`` exports that work, a
SIGKILLed service restarted, and nothing left behind after SIGINT/SIGTERM (a warm-pool pod
included: pods are found by the runtime's own rule, as they name the data dir nowhere)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import nats
import pytest

from services.cli import catalog
from shared.auth.keys import KvApiKeys, KvUsers
from shared.bus.kv import NatsBucket
from shared.bus.server import free_ports
from shared.bus.topology import KV_API_KEYS, KV_USERS
from tests.support import placeholder
from tests.support.env import TORPOR, clean_env, parse_exports, torpor
from tests.support.pods import instance_processes, pod_processes, service_pids
from tests.support.stack import up_args

pytestmark = pytest.mark.slow

POOL = "sandbox-base=1"


class Up:
    def __init__(self, data_dir: Path, *, placeholders: bool = False) -> None:
        self.data_dir = data_dir
        self.api_port, self.proxy_port = free_ports(2)
        # placeholders: torpor up supervising idle stand-ins (tests/support/placeholder.py)
        command = placeholder.COMMAND if placeholders else TORPOR
        self.proc = subprocess.Popen(
            [*command, *up_args(data_dir, self.api_port, self.proxy_port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # one warm pod (the real services only): a pod the stop must not leave behind
            env=clean_env(TORPOR_POOLS=POOL),
            start_new_session=True,
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, predicate: object, timeout: float = 90) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in list(self.lines):
                if predicate(line):  # type: ignore[operator]
                    return line
            assert self.proc.poll() is None, "torpor up exited:\n" + "\n".join(self.lines)
            time.sleep(0.2)
        raise AssertionError("timed out; output so far:\n" + "\n".join(self.lines))

    def wait_all_up(self) -> None:
        """Every service started and became ready (or at least stayed alive)."""
        for name in catalog.NAMES:
            self.wait_line(lambda line, n=name: f" {n} ready " in line or f" {n} running " in line)


@pytest.fixture
def up(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Up]:
    instance = Up(tmp_path / "data", placeholders=getattr(request, "param", False))
    yield instance
    if instance.proc.poll() is None:
        instance.proc.send_signal(signal.SIGKILL)
        instance.proc.wait(10)
    for pid in instance_processes(instance.data_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


async def test_up_env_restart_and_clean_sigterm(up: Up) -> None:
    up.wait_all_up()

    env = torpor("env", "--data-dir", str(up.data_dir))
    assert env.returncode == 0, env.stderr
    exports = parse_exports(env.stdout)
    assert exports["E2B_API_URL"] == f"http://127.0.0.1:{up.api_port}"
    assert exports["E2B_SANDBOX_URL"] == f"http://127.0.0.1:{up.proxy_port}"
    # The exported NATS works (as the operator) and the exported key is a real admin key.
    assert exports["NATS_USER"] == "admin"
    nc = await nats.connect(
        exports["NATS_URL"], user=exports["NATS_USER"], password=exports["NATS_PASSWORD"]
    )
    try:
        js = nc.jetstream()
        users = KvUsers(NatsBucket(await js.key_value(KV_USERS)))
        keys = KvApiKeys(NatsBucket(await js.key_value(KV_API_KEYS)), users)
        user = await keys.authenticate(exports["E2B_API_KEY"])
        assert user is not None
        assert user.admin
    finally:
        await nc.close()
    key_file = up.data_dir / "admin-api-key"
    assert key_file.stat().st_mode & 0o777 == 0o600

    # kill -9 one service: it comes back with a new pid, the others keep theirs.
    victim = "scaler"
    old = service_pids(up.data_dir, (victim,)).get(victim)
    others = {n: pid for n, pid in service_pids(up.data_dir, catalog.NAMES).items() if n != victim}
    assert old is not None
    assert all(others.values()), others
    os.kill(old, signal.SIGKILL)
    up.wait_line(lambda line: f"{victim} exited code=-9" in line)
    deadline = time.monotonic() + 30
    new = None
    while time.monotonic() < deadline:
        new = service_pids(up.data_dir, (victim,)).get(victim)
        if new is not None and new != old:
            break
        time.sleep(0.2)
    assert new is not None
    assert new != old
    assert {n: service_pids(up.data_dir, catalog.NAMES).get(n) for n in others} == others

    # The scaler's runtime fills the pool: a running pod that SIGTERM must take down too.
    deadline = time.monotonic() + 120
    while not pod_processes(up.data_dir):
        assert time.monotonic() < deadline, "no warm pod started:\n" + "\n".join(up.lines)
        time.sleep(0.5)
    _stop_and_check_nothing_left(up, signal.SIGTERM)


# The supervisor alone (every service a placeholder), independent of the services' own code.
@pytest.mark.parametrize("up", [True], indirect=True, ids=["placeholders"])
def test_up_clean_sigint(up: Up) -> None:
    up.wait_all_up()
    assert instance_processes(up.data_dir)
    _stop_and_check_nothing_left(up, signal.SIGINT)


def _stop_and_check_nothing_left(up: Up, sig: signal.Signals) -> None:
    up.proc.send_signal(sig)
    assert up.proc.wait(60) == 0, "\n".join(up.lines)
    leftovers = instance_processes(up.data_dir)
    assert leftovers == [], leftovers
    assert not (up.data_dir / "torpor.json").exists()
    # The first key survives a restart (kept in the data dir).
    assert (up.data_dir / "admin-api-key").exists()
