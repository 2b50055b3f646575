"""Secrets only where they are needed, on a real ``torpor up``: a sandbox with a secret env var is
created, paused, resumed and killed through the unmodified SDK while sniffers listen on the bus —
the ``platform`` user on everything it may read, the operator on every command, event and dead
letter. None of them sees the env value, the daemon token, the traffic token or the API key.
Then error-provoking requests (an unhandled error, bad keys and tokens) leave no key or token in
any log file, and every log file is its owner's only."""

from __future__ import annotations

import asyncio
import contextlib
import json
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import nats
import pytest
from e2b import Sandbox

from shared.auth.traffic import traffic_token
from shared.bus import subjects as s
from shared.bus import topology as t
from tests.deploy.nats_auth import Errors
from tests.security.embedded import EmbeddedBus
from tests.support.stack import Stack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


@dataclass
class Sniffed:
    messages: list[tuple[str, bytes]] = field(default_factory=list)
    errors: Errors = field(default_factory=Errors)

    def blob(self) -> str:
        return "\n".join(
            f"{subject} {data.decode(errors='replace')}" for subject, data in self.messages
        )


@contextlib.asynccontextmanager
async def sniff(bus: EmbeddedBus, user: str, *subjects: str) -> AsyncIterator[Sniffed]:
    out = Sniffed()
    nc = await nats.connect(bus.url(user), error_cb=out.errors.record, allow_reconnect=False)

    async def keep(msg: nats.aio.msg.Msg) -> None:
        headers = json.dumps(msg.headers or {}).encode()
        out.messages.append((msg.subject, msg.data + b" " + headers))

    try:
        for subject in subjects:
            await nc.subscribe(subject, cb=keep)
        await nc.flush()
        yield out
    finally:
        await nc.drain()


def sdk(up: Stack, user: str = "alice") -> dict[str, object]:
    return up.sdk_opts(user)


@dataclass
class Secrets:
    env_value: str
    api_key: str
    envd_token: str = ""
    traffic_token: str = ""
    sandbox_id: str = ""

    def all(self) -> dict[str, str]:
        found = {
            "env value": self.env_value,
            "API key": self.api_key,
            "daemon token": self.envd_token,
            "traffic token": self.traffic_token,
        }
        return {k: v for k, v in found.items() if v}


def lifecycle_through_the_sdk(up: Stack, secrets: Secrets) -> None:
    sbx = Sandbox.create(
        template="sandbox-base",
        timeout=300,
        envs={"DB_PASSWORD": secrets.env_value},
        lifecycle={"on_timeout": "pause", "auto_resume": True},
        **sdk(up),
    )
    secrets.sandbox_id = sbx.sandbox_id
    secrets.envd_token = sbx._envd_access_token or ""  # type: ignore[attr-defined]
    # Derived from the daemon token (shared/auth/traffic.py): the value a client would send.
    secrets.traffic_token = sbx.traffic_access_token or traffic_token(
        sbx.sandbox_id, secrets.envd_token
    )
    assert secrets.envd_token, "the SDK got no daemon token: nothing to look for"
    # The value is where it is needed: in the sandbox.
    seen = sbx.commands.run('printf %s "$DB_PASSWORD"').stdout
    assert seen == secrets.env_value
    # A process that will be replayed on resume carries the secret in its own env too.
    sbx.commands.run(
        "sleep 1000", background=True, envs={"REPLAYED_SECRET": secrets.env_value}, timeout=0
    )
    assert sbx.pause() is True
    resumed = Sandbox.connect(sbx.sandbox_id, **sdk(up))
    assert resumed.commands.run('printf %s "$DB_PASSWORD"').stdout == secrets.env_value
    assert resumed.kill() is True


def assert_clean(where: str, text: str, secrets: Secrets) -> None:
    leaked = [name for name, value in secrets.all().items() if value in text]
    assert leaked == [], f"{where} shows the {leaked}"


async def read_event_history(bus: EmbeddedBus, sandbox_id: str) -> Sniffed:
    """What the platform user can read back from the event stream (an ephemeral consumer)."""
    out = Sniffed()
    nc = await nats.connect(bus.url("platform"), error_cb=out.errors.record)
    try:
        js = nc.jetstream()
        sub = await js.pull_subscribe(f"{s.EVT_PREFIX}.*.{sandbox_id}", stream=t.STREAM_EVT)
        with contextlib.suppress(nats.errors.TimeoutError, TimeoutError):
            while True:
                for msg in await sub.fetch(50, timeout=2):
                    out.messages.append((msg.subject, msg.data))
                    await msg.ack()
        await sub.unsubscribe()
    finally:
        await nc.close()
    return out


async def test_no_secret_on_the_bus_during_a_sandbox_lifecycle(full_up: Stack) -> None:
    bus = EmbeddedBus.of(full_up.data_dir)
    secrets = Secrets(env_value=f"s3cr3t-{uuid.uuid4().hex}", api_key=full_up.keys["alice"])
    async with (
        # Everything the platform user may subscribe to; ">" and the commands are refused.
        sniff(bus, "platform", f"{s.EVT_PREFIX}.>") as platform,
        # The operator sees every subject: commands, events, timers, dead letters, KV writes.
        sniff(bus, "admin", ">") as operator,
    ):
        denied = await nats.connect(bus.url("platform"), error_cb=platform.errors.record)
        try:
            await denied.subscribe(">")
            await platform.errors.wait_violation('subscription to ">"')
            await denied.subscribe(f"{s.CMD_PREFIX}.>")
            await platform.errors.wait_violation(f"{s.CMD_PREFIX}.>")
        finally:
            await denied.close()
        await asyncio.to_thread(lifecycle_through_the_sdk, full_up, secrets)
        await asyncio.sleep(1)  # the last events in flight

    sid = secrets.sandbox_id
    platform_subjects = {subject for subject, _ in platform.messages}
    for fact in ("created", "snapshotted", "paused", "resumed", "killed"):
        assert f"{s.EVT_PREFIX}.{fact}.{sid}" in platform_subjects, platform_subjects
    assert_clean("an event the platform user received", platform.blob(), secrets)
    history = await read_event_history(bus, sid)
    assert len(history.messages) >= 5
    assert_clean("the event history", history.blob(), secrets)

    # The operator's view: commands, events, timers and dead letters carry no secret either.
    # (Records and their replies do: the KV bucket, readable by torpor's services only, is where
    # the scaler gets env values and the daemon token from.)
    public = [
        (subject, data)
        for subject, data in operator.messages
        if subject.startswith(("sandbox.", "$JS.EVENT"))
    ]
    assert any(subject == f"{s.CMD_CREATE}.{sid}" for subject, _ in public)
    assert_clean(
        "a command, event, timer or dead letter",
        Sniffed(public).blob(),
        secrets,
    )
    record_writes = [d for subj, d in operator.messages if subj == f"$KV.{t.KV_SANDBOXES}.{sid}"]
    assert any(secrets.env_value.encode() in d for d in record_writes), "sniffer saw no record"


async def test_no_secret_in_dead_letters(full_up: Stack) -> None:
    """A malformed command quoting a secret is dead-lettered masked."""
    bus = EmbeddedBus.of(full_up.data_dir)
    secret = f"dlq-{uuid.uuid4().hex}"
    sid = "dlq-" + uuid.uuid4().hex[:8]
    nc = await nats.connect(bus.url("platform"))
    try:
        body = {"sandbox_id": sid, "owner": 7, "envs": {"TOKEN": secret}, "access_token": secret}
        await nc.jetstream().publish(f"{s.CMD_CREATE}.{sid}", json.dumps(body).encode())
    finally:
        await nc.close()
    admin = await nats.connect(bus.url("admin"))
    try:
        js = admin.jetstream()
        subject = f"{s.DLQ_PREFIX}.scaler-lifecycle.{sid}"
        for _ in range(100):
            with contextlib.suppress(nats.js.errors.NotFoundError):
                msg = await js.get_last_msg(t.STREAM_DLQ, subject)
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the malformed command was not dead-lettered")
    finally:
        await admin.close()
    text = msg.data.decode() + json.dumps(dict(msg.headers or {}))
    assert "owner" in (msg.headers or {}).get("x-error", "")
    assert secret not in text
    assert json.loads(msg.data)["sandbox_id"] == sid


async def test_error_paths_leave_no_key_or_token_in_any_log(full_up: Stack) -> None:
    bus = EmbeddedBus.of(full_up.data_dir)
    alice = full_up.keys["alice"]
    sbx = await asyncio.to_thread(Sandbox.create, template="sandbox-base", **sdk(full_up))
    token = sbx._envd_access_token or ""  # type: ignore[attr-defined]
    bogus = {
        "e2b key": "e2b_" + uuid.uuid4().hex,
        "torpor key": "torpor_" + uuid.uuid4().hex,
        "access token": uuid.uuid4().hex,
    }
    broken = "broken-" + uuid.uuid4().hex[:8]
    async with httpx.AsyncClient(timeout=30) as http:
        # An unhandled error: a record that does not parse, read with a valid key (the request's
        # headers were in the traceback's frame locals).
        admin = await nats.connect(bus.url("admin"))
        try:
            kv = await admin.jetstream().key_value(t.KV_SANDBOXES)
            await kv.put(broken, b'{"sandbox_id": "' + broken.encode() + b'", "owner": 1}')
            r = await http.get(
                f"{full_up.api_url}/sandboxes/{broken}",
                headers={"X-API-KEY": alice, "X-Access-Token": token},
            )
            assert r.status_code == 500
            assert r.json() == {"code": 500, "message": "internal error"}
            # After an unhandled error the server closes the connection: a fresh one.
            async with httpx.AsyncClient(timeout=30) as fresh:
                r = await fresh.get(
                    f"{full_up.api_url}/api/v1/sandbox/{broken}",
                    headers={"Authorization": f"Bearer {alice}"},
                )
            assert r.status_code == 500
            assert alice not in r.text
        finally:
            with contextlib.suppress(Exception):
                await kv.purge(broken)
            await admin.close()
    async with httpx.AsyncClient(timeout=30) as http:
        # Bad keys and tokens everywhere they are taken.
        for value in bogus.values():
            for headers in ({"X-API-KEY": value}, {"Authorization": f"Bearer {value}"}):
                r = await http.get(f"{full_up.api_url}/sandboxes", headers=headers)
                assert r.status_code == 401
                assert value not in r.text
            # Sign-in needs its CSRF token first, so the bad key reaches the key check.
            issued = await http.get(f"{full_up.api_url}/dashboard/api/csrf")
            csrf = issued.json()["csrfToken"]
            r = await http.post(
                f"{full_up.api_url}/dashboard/login",
                json={"apiKey": value},
                headers={"X-CSRF-Token": csrf, "Cookie": f"torpor_login_csrf={csrf}"},
            )
            assert r.status_code == 401, r.text
            assert value not in r.text
            to = {"E2b-Sandbox-Id": sbx.sandbox_id, "E2b-Sandbox-Port": "49983"}
            r = await http.post(
                f"{full_up.proxy_url}/process.Process/List",
                headers={
                    **to,
                    "X-Access-Token": value,
                    "Content-Type": "application/json",
                    "Connect-Protocol-Version": "1",
                },
                json={},
            )
            assert r.status_code == 401
            assert value not in r.text
    await asyncio.to_thread(sbx.kill)

    logs = log_files(full_up.data_dir)
    api_log = (full_up.data_dir / "logs" / "api.log").read_text(errors="replace")
    assert "unhandled_error" in api_log, "the unhandled error path did not run"
    secrets = {"alice's key": alice, "daemon token": token, **bogus}
    secrets |= {f"{u}'s key": k for u, k in full_up.keys.items()}
    for path in logs:
        text = path.read_text(errors="replace")
        leaked = [name for name, value in secrets.items() if value and value in text]
        assert leaked == [], f"{path} contains the {leaked}"


def log_files(data_dir: Path) -> list[Path]:
    found = sorted(p for p in data_dir.rglob("*.log") if p.is_file())
    assert any(p.name == "api.log" for p in found)
    assert any(p.name == "nats-server.log" for p in found)
    return found


def test_log_files_are_owner_only(full_up: Stack) -> None:
    for path in log_files(full_up.data_dir):
        assert path.stat().st_mode & 0o077 == 0, f"{path} is {oct(path.stat().st_mode & 0o777)}"
    for folder in (full_up.data_dir, full_up.data_dir / "logs", full_up.data_dir / "nats"):
        assert folder.stat().st_mode & 0o077 == 0, f"{folder} is readable by others"
