"""Each sandbox's NetworkPolicy is enforced on its real egress, against an "outside host" the
test creates (a network namespace routed through the host, tests/security/network_support.py):
default egress reaches it, ``allow_internet=False`` blocks it, ``allow_out``/``deny_out`` by
CIDR, changes applied live and kept across scale 0/1 (pause/resume). First at the runtime port
(LocalRuntime + NetworkPolicy), then end to end with the unmodified e2b SDK."""

from __future__ import annotations

import asyncio
import ipaddress
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from e2b import Sandbox

from shared.envd.client import ConnectEnvdClient
from shared.models.network import NetworkPolicy
from shared.models.snapshots import ProcessConfig
from shared.ports.workloads import Endpoint, WorkloadSpec
from shared.runtime.local import LocalRuntime
from tests.contract.harness import read_file, write_file
from tests.security.network_support import OutsideHost, leftovers, require_root_network
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

PROBE = textwrap.dedent(
    """
    import socket, sys
    s = socket.socket(); s.settimeout(3)
    try:
        s.connect((sys.argv[1], int(sys.argv[2]))); print("ok", s.recv(16).decode())
    except OSError as e:
        print(type(e).__name__)
    """
)
READY = 60.0


async def pod_probe(envd: ConnectEnvdClient, ep: Endpoint, outside: OutsideHost) -> str:
    """Connect from inside the pod (a process the daemon starts) to the outside host."""
    tag = uuid.uuid4().hex[:8]
    await write_file(ep, "/workspace/probe.py", PROBE.encode())
    out = f"/workspace/probe-{tag}.txt"
    script = f"python3 /workspace/probe.py {outside.address} {outside.port} > {out}.tmp 2>&1"
    await envd.start_process(
        ep,
        ProcessConfig(cmd="/bin/sh", args=["-c", f"{script}; mv {out}.tmp {out}"]),
        tag=None,
        access_token=None,
    )
    for _ in range(200):
        data = await read_file(ep, out)
        if data is not None:
            return data.decode().strip()
        await asyncio.sleep(0.05)
    raise AssertionError("the probe never finished")


@pytest.fixture
async def runtime(nats_url: str, tmp_path: Path) -> AsyncIterator[LocalRuntime]:
    require_root_network()
    rt = LocalRuntime(
        nats_url=nats_url,
        data_dir=tmp_path / "rt",
        bucket=f"wl_{uuid.uuid4().hex[:12]}",
        stop_grace=1.0,
        poll_interval=0.2,
    )
    await rt.start()
    try:
        yield rt
    finally:
        await rt.close()
        assert leftovers(tmp_path / "rt") == []


async def test_policy_at_the_runtime_port(runtime: LocalRuntime, outside_host: OutsideHost) -> None:
    envd = ConnectEnvdClient()
    target = outside_host.address
    block = str(ipaddress.ip_network(f"{target}/30", strict=False))
    try:
        name = f"sbx-{uuid.uuid4().hex[:10]}"
        await runtime.create(
            WorkloadSpec(name=name, owner="alice", network=NetworkPolicy(allow_internet=False))
        )
        ep = await runtime.wait_ready(name, timeout=READY)
        assert not (await pod_probe(envd, ep, outside_host)).startswith("ok")

        live = [
            (NetworkPolicy(), True),  # the default: egress allowed
            (NetworkPolicy(deny_out=(block,)), False),
            (NetworkPolicy(deny_out=("0.0.0.0/0",), allow_out=(f"{target}/32",)), True),
            (NetworkPolicy(allow_out=("10.0.0.0/8",), deny_out=(target,)), False),
            (NetworkPolicy(allow_internet=False, allow_out=(block,)), True),
        ]
        for policy, reachable in live:
            await runtime.set_network(name, policy)  # the same pod, at once
            got = await pod_probe(envd, ep, outside_host)
            assert got.startswith("ok") is reachable, (policy, got)
            assert policy.permits(target) is reachable

        # Paused (scale 0) then changed: the next pod gets the new policy, same address.
        await runtime.scale(name, 0)
        await runtime.wait_stopped(name, timeout=READY)
        await runtime.set_network(name, NetworkPolicy(deny_out=(f"{target}/32",)))
        await runtime.scale(name, 1)
        again = await runtime.wait_ready(name, timeout=READY)
        assert again.pod_uid != ep.pod_uid and again.host == ep.host
        assert not (await pod_probe(envd, again, outside_host)).startswith("ok")
        # ... and kept when nothing changed across another 0/1.
        await runtime.scale(name, 0)
        await runtime.wait_stopped(name, timeout=READY)
        await runtime.scale(name, 1)
        third = await runtime.wait_ready(name, timeout=READY)
        assert not (await pod_probe(envd, third, outside_host)).startswith("ok")

        # A second sandbox with the default policy reaches it meanwhile: policies are per pod.
        other = f"sbx-{uuid.uuid4().hex[:10]}"
        await runtime.create(WorkloadSpec(name=other, owner="bob"))
        other_ep = await runtime.wait_ready(other, timeout=READY)
        assert (await pod_probe(envd, other_ep, outside_host)) == "ok hello"
        await runtime.delete(other)
        await runtime.delete(name)
    finally:
        await envd.close()


# ---- end to end: the SDK's network options ----------------------------------------------


def sdk_probe(sbx: Sandbox, outside: OutsideHost) -> str:
    sbx.files.write("/tmp/probe.py", PROBE)
    return sbx.commands.run(f"python3 /tmp/probe.py {outside.address} {outside.port}").stdout


def eventually(sbx: Sandbox, outside: OutsideHost, *, reachable: bool) -> None:
    """Updates travel API → bus → scaler → nftables: wait (bounded) until they hold."""
    deadline = time.monotonic() + 30
    while (got := sdk_probe(sbx, outside)).startswith("ok") is not reachable:
        assert time.monotonic() < deadline, f"still {got!r}, want reachable={reachable}"
        time.sleep(0.3)


def test_sdk_network_options_are_enforced(stack: Stack, outside_host: OutsideHost) -> None:
    require_root_network()
    target = outside_host.address
    open_sbx = Sandbox.create(template="sandbox-base", timeout=300, **stack.sdk_opts())
    closed = Sandbox.create(
        template="sandbox-base",
        timeout=300,
        allow_internet_access=False,
        lifecycle={"on_timeout": "pause", "auto_resume": True},
        **stack.sdk_opts(),
    )
    denied = Sandbox.create(
        template="sandbox-base",
        timeout=300,
        network={"deny_out": [f"{target}/32"]},
        **stack.sdk_opts(),
    )
    try:
        assert sdk_probe(open_sbx, outside_host).strip() == "ok hello"
        assert not sdk_probe(closed, outside_host).startswith("ok")
        assert not sdk_probe(denied, outside_host).startswith("ok")

        closed.update_network({"allow_out": [target], "deny_out": ["0.0.0.0/0"]})
        eventually(closed, outside_host, reachable=True)
        closed.update_network({"deny_out": [f"{target}/30"]})
        eventually(closed, outside_host, reachable=False)

        assert closed.pause() is True
        resumed = Sandbox.connect(closed.sandbox_id, **stack.sdk_opts())
        assert not sdk_probe(resumed, outside_host).startswith("ok")  # kept across the pause
        resumed.update_network({})
        eventually(resumed, outside_host, reachable=True)
    finally:
        for sbx in (open_sbx, closed, denied):
            sbx.kill()
