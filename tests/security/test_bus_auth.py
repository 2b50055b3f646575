"""``torpor up``'s embedded NATS is authenticated: no anonymous client, no monitoring port, the
same least-privilege users as ``deploy/nats`` (the deploy tests' checks, run on this bus), each
service process holding only its own password, and a warning from a service on an open bus."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

import nats
import nats.errors
import pytest

from shared.bus import topology as t
from shared.bus.server import EmbeddedNats, free_port
from tests.deploy import test_nats_auth as deploy
from tests.deploy.nats_auth import NATS_DIR, connect
from tests.security.embedded import (
    EmbeddedBus,
    environ_of,
    listening_ports,
    nats_server_pid,
    service_pids,
)
from tests.support import placeholder
from tests.support.env import REPO, TORPOR, cli_env, parse_exports

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

USERS = ("admin", *deploy.SERVICES, "platform")


async def refused(url: str) -> None:
    with pytest.raises((nats.errors.Error, OSError)) as caught:
        await nats.connect(url, allow_reconnect=False, connect_timeout=2)
    assert "authorization violation" in str(caught.value).lower()


# ------------------------------------------------------------------ who may connect


async def test_an_anonymous_client_is_refused(placeholder_bus: EmbeddedBus) -> None:
    await refused(placeholder_bus.anonymous_url)


async def test_a_wrong_password_or_unknown_user_is_refused(placeholder_bus: EmbeddedBus) -> None:
    port = placeholder_bus.port
    await refused(f"nats://api:{placeholder_bus.passwords['scaler']}@127.0.0.1:{port}")
    await refused(f"nats://admin:nope@127.0.0.1:{port}")
    await refused(f"nats://root:{placeholder_bus.passwords['admin']}@127.0.0.1:{port}")
    # An option-looking user name is just an unknown user.
    await refused(f"nats://--ro-bind:x@127.0.0.1:{port}")


def test_there_is_no_monitoring_port(placeholder_bus: EmbeddedBus) -> None:
    """nats-server cannot authenticate its HTTP monitoring port (varz, connz, jsz): it is off."""
    pid = nats_server_pid(placeholder_bus.data_dir)
    assert listening_ports(pid) == {placeholder_bus.port}
    conf = (placeholder_bus.data_dir / "nats" / "nats-server.conf").read_text()
    assert "http" not in conf
    assert "include ./auth.conf" in conf


def test_embedded_permissions_are_the_deploy_file(placeholder_bus: EmbeddedBus) -> None:
    """One definition (shared/bus/permissions.py) renders both: byte-identical, no secret."""
    embedded = (placeholder_bus.data_dir / "nats" / "auth.conf").read_text()
    assert embedded == (NATS_DIR / "auth.conf").read_text()
    for password in placeholder_bus.passwords.values():
        assert password not in embedded


def test_credentials_are_owner_only_and_complete(placeholder_bus: EmbeddedBus) -> None:
    folder = placeholder_bus.data_dir / "nats"
    assert set(placeholder_bus.passwords) == set(USERS)
    assert len(set(placeholder_bus.passwords.values())) == len(USERS)
    assert (folder / "credentials.json").stat().st_mode & 0o777 == 0o600
    assert folder.stat().st_mode & 0o777 == 0o700
    assert placeholder_bus.data_dir.stat().st_mode & 0o077 == 0


def test_each_service_process_holds_only_its_own_password(placeholder_bus: EmbeddedBus) -> None:
    pids = service_pids(placeholder_bus.data_dir)
    assert set(pids) == set(deploy.SERVICES)
    for name, pid in pids.items():
        env = environ_of(pid)
        assert env["NATS_USER"] == name
        assert env["NATS_PASSWORD"] == placeholder_bus.passwords[name]
        assert env["TORPOR_BUS_PROVISION"] == "false"
        blob = "\0".join(f"{k}={v}" for k, v in env.items())
        others = [u for u, p in placeholder_bus.passwords.items() if u != name and p in blob]
        assert others == [], f"{name} can see the passwords of {others}"


# ------------------------------------------------------------------ each user, its job only


@pytest.mark.parametrize("service", deploy.SERVICES)
async def test_service_does_its_job_with_its_own_user(
    placeholder_bus: EmbeddedBus, service: str
) -> None:
    await deploy.test_service_does_its_job_with_its_own_user(placeholder_bus, service)


@pytest.mark.parametrize("service", deploy.SERVICES)
async def test_service_cannot_leave_its_lane(placeholder_bus: EmbeddedBus, service: str) -> None:
    await deploy.test_service_cannot_leave_its_lane(placeholder_bus, service)


@pytest.mark.parametrize(
    "user",
    [
        "scaler",
        "snapshotter",
        "builder",
        "api",
        "proxy",
        "scheduler",
        "deliverer",
        "ledger",
        "platform",
    ],
)
async def test_only_the_runtime_services_reach_the_workload_records(
    placeholder_bus: EmbeddedBus, user: str
) -> None:
    """The local runtime's bucket (pods' tokens and envs) is the scaler's and snapshotter's, and
    the builder's (its build pods are local-runtime workloads)."""
    async with connect(placeholder_bus, user, inbox_prefix=f"_INBOX_{user}") as (nc, errors):
        js = nc.jetstream()
        if user in {"scaler", "snapshotter", "builder"}:
            kv = await js.key_value(t.KV_WORKLOADS)
            await kv.put(f"probe.{user}", b"x")
            assert (await kv.get(f"probe.{user}")).value == b"x"
            await kv.purge(f"probe.{user}")
            assert errors.violations() == []
        else:
            await nc.publish(f"$KV.{t.KV_WORKLOADS}.wl.forged", b"{}")
            await errors.wait_violation(f"$KV.{t.KV_WORKLOADS}.wl.forged")
            with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
                await js.key_value(t.KV_WORKLOADS)


@pytest.mark.parametrize("user", [u for u in USERS if u != "admin"])
async def test_only_the_runtime_services_reach_the_kept_files(
    placeholder_bus: EmbeddedBus, user: str
) -> None:
    """The kept-files object store (sandboxes' files while paused on Kubernetes): the
    snapshotter uploads at pause, the scaler restores and deletes; nobody else reads or writes."""
    import tempfile

    from shared.bus.kept_files import NatsKeptFiles
    from shared.ports.kept_files import KeptKey

    async with connect(placeholder_bus, user, inbox_prefix=f"_INBOX_{user}") as (nc, errors):
        store = NatsKeptFiles(nc.jetstream())
        key = KeptKey.sandbox(f"iprobe{user}")
        if user in {"scaler", "snapshotter"}:
            with tempfile.TemporaryFile() as fh:
                fh.write(b"kept")
                fh.seek(0)
                await store.put(key, fh, limit=100)  # type: ignore[arg-type]
            with tempfile.TemporaryFile() as out:
                assert await store.get(key, out)  # type: ignore[arg-type]
                out.seek(0)
                assert out.read() == b"kept"
            await store.delete(key)
            assert errors.violations() == []
        else:
            await nc.publish(f"$O.{t.OBJ_KEPT_FILES}.M.forged", b"{}")
            await errors.wait_violation(f"$O.{t.OBJ_KEPT_FILES}.M.forged")
            info = f"$JS.API.STREAM.INFO.OBJ_{t.OBJ_KEPT_FILES}"
            await nc.publish(info, b"")
            await errors.wait_violation(info)


async def test_platform_publishes_a_pause_command_and_reads_events(
    placeholder_bus: EmbeddedBus,
) -> None:
    await deploy.test_platform_publishes_a_pause_command_and_reads_events(placeholder_bus)


async def test_platform_cannot_write_the_kv_bucket(placeholder_bus: EmbeddedBus) -> None:
    await deploy.test_platform_cannot_write_the_kv_bucket(placeholder_bus)


async def test_platform_cannot_consume_a_service_queue(placeholder_bus: EmbeddedBus) -> None:
    await deploy.test_platform_cannot_consume_a_service_queue(placeholder_bus)


async def test_platform_cannot_do_anything_else(placeholder_bus: EmbeddedBus) -> None:
    await deploy.test_platform_cannot_do_anything_else(placeholder_bus)


# ------------------------------------------------------------------ the CLI's credentials


def _torpor(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TORPOR, *args],
        capture_output=True,
        text=True,
        env=cli_env(),
        cwd=REPO,
        timeout=60,
        check=False,
    )


async def test_torpor_env_exports_the_operator_or_the_platform_user(
    placeholder_bus: EmbeddedBus,
) -> None:
    data = str(placeholder_bus.data_dir)
    out = _torpor("env", "--data-dir", data)
    assert out.returncode == 0, out.stderr
    operator = parse_exports(out.stdout)
    assert operator["NATS_USER"] == "admin"
    assert operator["NATS_URL"] == placeholder_bus.anonymous_url  # no password in the URL
    nc = await nats.connect(
        operator["NATS_URL"], user=operator["NATS_USER"], password=operator["NATS_PASSWORD"]
    )
    try:
        info = await nc.jetstream().stream_info(t.STREAM_CMD)
        assert info.config.name == t.STREAM_CMD
    finally:
        await nc.close()

    out = _torpor("env", "--data-dir", data, "--nats-user", "platform")
    assert out.returncode == 0, out.stderr
    platform = parse_exports(out.stdout)
    assert platform["NATS_USER"] == "platform"
    assert "E2B_API_KEY" not in platform
    assert platform["NATS_PASSWORD"] == placeholder_bus.passwords["platform"]

    for hostile in ("api", "--ro-bind", "platform ", "ADMIN", "x" * 10_000):
        out = _torpor("env", "--data-dir", data, "--nats-user", hostile)
        assert out.returncode == 2
        assert "--nats-user must be" in out.stderr
        assert placeholder_bus.passwords.get("api", "?") not in out.stdout + out.stderr


def test_torpor_keys_talks_to_the_bus_as_the_operator(placeholder_bus: EmbeddedBus) -> None:
    data = str(placeholder_bus.data_dir)
    created = _torpor("keys", "create", "carol", "--data-dir", data)
    assert created.returncode == 0, created.stderr
    listed = _torpor("keys", "list", "--data-dir", data)
    assert listed.returncode == 0, listed.stderr
    assert "carol" in listed.stdout
    assert created.stdout.strip() not in listed.stdout  # the secret is shown once only


# ------------------------------------------------------------------ the open-bus warning


def _run_placeholder(nats_url: str, **extra: str) -> str:
    """Start one service (a placeholder: connects, serves health) and return its log once it
    is ready."""
    proc = subprocess.Popen(
        [*placeholder.COMMAND, "run", "scheduler"],
        cwd=REPO,
        env=cli_env(
            NATS_URL=nats_url,
            TORPOR_HEALTH_PORT=str(free_port()),
            TORPOR_HEALTH_HOST="127.0.0.1",
            **extra,
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 60
        os.set_blocking(proc.stdout.fileno(), False)
        while time.monotonic() < deadline and not any(placeholder.READY in x for x in lines):
            chunk = proc.stdout.readline()
            if chunk:
                lines.append(chunk)
            elif proc.poll() is not None:
                break
            else:
                time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(20)
    text = "".join(lines)
    assert placeholder.READY in text, text
    return text


async def test_a_service_on_an_open_bus_warns_once(tmp_path: Path) -> None:
    server = EmbeddedNats(data_dir=tmp_path / "open-nats").start()
    try:
        anonymous = await asyncio.to_thread(_run_placeholder, server.url)
        assert anonymous.count("bus_anonymous_access") == 1, anonymous
        # Credentials do not help when the server ignores them; none is logged.
        with_password = await asyncio.to_thread(
            _run_placeholder, server.url, NATS_USER="scheduler", NATS_PASSWORD="pSECRETpw"
        )
        assert with_password.count("bus_anonymous_access") == 1, with_password
        assert "pSECRETpw" not in with_password
    finally:
        server.stop()


def test_services_on_the_authenticated_bus_do_not_warn(placeholder_bus: EmbeddedBus) -> None:
    for name in ("api", "proxy", "scheduler", "snapshotter", "scaler"):
        log = (placeholder_bus.data_dir / "logs" / f"{name}.log").read_text()
        assert placeholder.READY in log
        assert "bus_anonymous_access" not in log
