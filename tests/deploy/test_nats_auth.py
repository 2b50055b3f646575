"""The shipped NATS permissions on a real nats-server: every service can do its job with its own
user through torpor's own bus code, and the ``platform`` user can publish a pause command and
read events but cannot write the KV bucket or consume a service's queue."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import nats.errors
import pytest
from nats.js.api import ConsumerConfig
from nats.js.errors import KeyNotFoundError, NoKeysError
from pydantic import BaseModel

from shared.bus import subjects as s
from shared.bus import topology as t
from shared.bus.broker import ANSWER_WITHIN, key_value, make_broker, prepare, subscriber_args
from shared.bus.event_log import NatsEventLog
from shared.bus.publishing import BrokerPublisher
from shared.bus.records import KvSandboxStore
from shared.domain.record import SandboxRecord
from shared.errors import ConfigError
from shared.settings import BusSettings
from tests.deploy.nats_auth import (
    NATS_DIR,
    AuthNats,
    Errors,
    connect,
    load_generator,
    password,
    start_auth_nats,
)

pytestmark = pytest.mark.timeout(120)

SERVICES = (
    "api",
    "proxy",
    "scheduler",
    "snapshotter",
    "scaler",
    "deliverer",
    "ledger",
    "builder",
)


class Probe(BaseModel):
    sandbox_id: str


def record(sandbox_id: str) -> SandboxRecord:
    now = datetime.now(UTC)
    return SandboxRecord(
        sandbox_id=sandbox_id, owner="alice", created_at=now, started_at=now, updated_at=now
    )


@dataclass(frozen=True)
class Job:
    """What a service does on the bus (stated here independently of the generator)."""

    publishes: tuple[str, ...] = ()
    binds: tuple[t.Durable, ...] = ()
    kv_reads: tuple[str, ...] = ()
    kv_writes: tuple[str, ...] = ()
    dead_letters: bool = False
    schedules: bool = False


ALL_KV = (t.KV_SANDBOXES, t.KV_USERS, t.KV_API_KEYS)
JOBS: dict[str, Job] = {
    "api": Job(
        publishes=(
            s.CMD_CREATE,
            s.CMD_PAUSE,
            s.CMD_RESUME,
            s.CMD_KILL,
            s.CMD_NETWORK,
            s.CMD_TEMPLATE_BUILD,
            s.EVT_TIMEOUT_SET,
            s.EVT_ACTIVITY,
        ),
        kv_reads=(*ALL_KV, t.KV_TEMPLATES),
        kv_writes=(t.KV_SANDBOXES, t.KV_TEMPLATES),
    ),
    "proxy": Job(
        publishes=(s.CMD_RESUME, s.EVT_ACTIVITY, s.EVT_TIMEOUT_SET),
        kv_reads=ALL_KV,
        kv_writes=(t.KV_SANDBOXES,),
    ),
    "scheduler": Job(
        publishes=(s.CMD_PAUSE, s.CMD_KILL, s.EVT_EXPIRED, s.EVT_FAILED),
        binds=(t.SCHEDULER_LIFECYCLE, t.SCHEDULER_FIRED),
        kv_reads=(t.KV_SANDBOXES,),
        kv_writes=(t.KV_SANDBOXES,),
        dead_letters=True,
        schedules=True,
    ),
    "snapshotter": Job(
        publishes=(s.EVT_SNAPSHOTTED, s.EVT_FAILED),
        binds=(t.SNAPSHOTTER_PAUSE,),
        kv_reads=(t.KV_SANDBOXES,),
        kv_writes=(t.KV_SANDBOXES,),
        dead_letters=True,
    ),
    "scaler": Job(
        publishes=(s.EVT_CREATED, s.EVT_PAUSED, s.EVT_RESUMED, s.EVT_KILLED, s.EVT_FAILED),
        binds=(t.SCALER_LIFECYCLE, t.SCALER_ON_SNAPSHOTTED),
        kv_reads=(t.KV_SANDBOXES,),
        kv_writes=(t.KV_SANDBOXES,),
        dead_letters=True,
    ),
    "deliverer": Job(
        publishes=(s.WEBHOOK_DELIVERY,),
        binds=(t.DELIVERER_EVENTS, t.DELIVERER_SEND),
        kv_reads=(t.KV_SANDBOXES, t.KV_WEBHOOKS, t.KV_DELIVERIES),
        dead_letters=True,
    ),
    "ledger": Job(
        binds=(t.LEDGER_EVENTS,),
        kv_reads=(t.KV_SANDBOXES, t.KV_USAGE),
        dead_letters=True,
    ),
    "builder": Job(
        binds=(t.BUILDER_BUILDS,),
        kv_reads=(t.KV_TEMPLATES, t.KV_SANDBOXES, t.KV_SNAPSHOTS),
        kv_writes=(t.KV_TEMPLATES,),
        dead_letters=True,
    ),
}

# Things a service must NOT be able to do (one representative denial each).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "api": (
        f"$JS.API.CONSUMER.MSG.NEXT.{t.STREAM_CMD}.snapshotter-pause",
        "sandbox.evt.paused.x",
        # the events API's own consumers on SANDBOX_EVT, never a service's durable
        f"$JS.API.CONSUMER.MSG.NEXT.{t.STREAM_EVT}.scheduler-lifecycle",
        f"$JS.API.CONSUMER.CREATE.{t.STREAM_EVT}.scheduler-lifecycle",
    ),
    "proxy": (f"$KV.{t.KV_API_KEYS}.x", "sandbox.cmd.kill.x"),
    "scheduler": ("sandbox.cmd.create.x", f"$JS.API.STREAM.DELETE.{t.STREAM_CMD}"),
    "snapshotter": ("sandbox.cmd.pause.x", f"$KV.{t.KV_API_KEYS}.x"),
    "deliverer": (
        "sandbox.cmd.pause.x",
        "sandbox.evt.paused.x",
        f"$KV.{t.KV_WEBHOOKS}.x",  # reads registrations, never writes them
        f"$KV.{t.KV_SANDBOXES}.x",
    ),
    "ledger": (
        "sandbox.cmd.kill.x",
        "sandbox.evt.created.x",
        f"$KV.{t.KV_SANDBOXES}.x",
        f"$KV.{t.KV_WEBHOOKS}.x",
    ),
    "scaler": (
        "sandbox.cmd.pause.x",
        f"$JS.API.CONSUMER.MSG.NEXT.{t.STREAM_EVT}.scheduler-lifecycle",
    ),
    # records of sandboxes and snapshots are not the builder's to write; nor are commands
    "builder": (f"$KV.{t.KV_SANDBOXES}.x", f"$KV.{t.KV_SNAPSHOTS}.x", "sandbox.cmd.create.x"),
}


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def auth_nats(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AuthNats]:
    yield from start_auth_nats(tmp_path_factory.mktemp("nats-auth"))


@pytest.fixture(scope="module")
async def provisioned(auth_nats: AuthNats) -> AuthNats:
    """The provisioning Job's work, done with the admin user (services may not create streams)."""
    async with connect(auth_nats, "admin") as (nc, errors):
        await t.ensure_topology(nc.jetstream(), replicas=1)
        assert errors.violations() == []
    return auth_nats


@contextlib.asynccontextmanager
async def admin(server: AuthNats) -> AsyncIterator[Any]:
    async with connect(server, "admin") as (nc, _):
        yield nc.jetstream()


async def eventually(check: Any, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        if await check():
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met in {timeout}s: {check.__name__}")
        await asyncio.sleep(0.05)


# ------------------------------------------------------------------ the shipped file


def test_committed_auth_conf_is_generated_from_the_topology() -> None:
    gen = load_generator()
    assert (NATS_DIR / "auth.conf").read_text() == gen.render(gen.users()), (
        "deploy/nats/auth.conf is stale: run "
        ".venv/bin/python deploy/nats/gen_auth.py > deploy/nats/auth.conf"
    )


def test_every_service_has_a_user_and_no_password_is_shipped() -> None:
    text = (NATS_DIR / "auth.conf").read_text()
    names = {u.name for u in load_generator().users()}
    assert names == {*SERVICES, "platform", "admin"}
    for name in names:
        assert f"password: $NATS_{name.upper()}_PASSWORD" in text


async def test_a_wrong_password_is_refused(provisioned: AuthNats) -> None:
    with pytest.raises((nats.errors.Error, OSError)):
        await nats.connect(
            provisioned.url("api").replace("test-api", "nope"),
            allow_reconnect=False,
            connect_timeout=2,
        )


# ------------------------------------------------------------------ each service does its job


@pytest.mark.parametrize("service", SERVICES)
async def test_service_does_its_job_with_its_own_user(provisioned: AuthNats, service: str) -> None:
    job = JOBS[service]
    sid = f"{service}-job"
    errors = Errors()
    settings = BusSettings(nats_url=provisioned.url(service), bus_provision=False)
    broker = make_broker(settings, service=service, error_cb=errors.record)
    got: dict[str, set[str]] = {d.name: set() for d in job.binds}

    for durable in job.binds:

        def make_handler(name: str) -> Any:
            async def handler(body: dict[str, Any]) -> None:
                got[name].add(str(body.get("sandbox_id")))

            return handler

        broker.subscriber(**subscriber_args(durable, max_workers=1))(make_handler(durable.name))

    async with admin(provisioned) as js:
        await KvSandboxStore(await js.key_value(t.KV_SANDBOXES)).create(record(f"{sid}-seed"))

    await prepare(broker, settings)
    await broker.start()
    try:
        publisher = BrokerPublisher(broker)
        for prefix in job.publishes:
            assert await publisher.publish(
                Probe(sandbox_id=sid), s.of(prefix, sid), msg_id=f"{prefix}:{sid}"
            )
        if service == "api":  # the dashboard's event feed: live core subscription + history
            nc = broker.config.connection_state.connection
            live = await nc.subscribe(f"{s.EVT_PREFIX}.>")
            await nc.flush()
            js = broker.config.connection_state.stream
            await js.get_msg(t.STREAM_EVT, subject=s.of(s.EVT_ACTIVITY, sid))
            await live.unsubscribe()
            # the events API: a short-lived consumer of its own, read back and deleted
            read = await NatsEventLog(js, service="api").read([s.of(s.EVT_ACTIVITY, sid)], limit=10)
            assert [e.subject for e in read] == [s.of(s.EVT_ACTIVITY, sid)]
        if job.dead_letters:
            assert await publisher.publish(
                Probe(sandbox_id=sid), f"{s.DLQ_PREFIX}.test.{sid}", msg_id=f"dlq:{sid}"
            )

        for bucket in job.kv_reads:
            kv = await key_value(broker, bucket)
            with pytest.raises(KeyNotFoundError):
                await kv.get("absent")
            with contextlib.suppress(NoKeysError):
                await kv.keys()
        if t.KV_SANDBOXES in job.kv_reads:
            store = KvSandboxStore(await key_value(broker, t.KV_SANDBOXES))
            assert (await store.get(f"{sid}-seed")) is not None
            seen = await store.wait_for(
                f"{sid}-seed", lambda r: r.owner == "alice", timeout=5
            )  # watch
            assert seen.sandbox_id == f"{sid}-seed"
        if t.KV_SANDBOXES in job.kv_writes:
            store = KvSandboxStore(await key_value(broker, t.KV_SANDBOXES))
            await store.create(record(sid))
            updated = await store.update(
                sid, lambda r: r.model_copy(update={"generation": r.generation + 1})
            )
            assert updated.generation == 1
            await store.delete(sid)
            assert await store.get(sid) is None

        if job.schedules:
            due = datetime.now(UTC) + timedelta(milliseconds=300)
            await broker.publish(
                {"sandbox_id": sid},
                s.of(s.SCHED_TIMEOUT, sid),
                stream=t.STREAM_TIMERS,
                headers={
                    "Nats-Schedule": f"@at {due.isoformat()}",
                    "Nats-Schedule-Target": s.of(s.TIMER_FIRED, sid),
                },
            )
            # Read a pending holder back, and cancel one (purge by subject).
            js = broker.config.connection_state.stream
            other = s.of(s.SCHED_TIMEOUT, f"{sid}-cancel")
            later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
            await js.publish(
                other,
                b"{}",
                headers={
                    "Nats-Schedule": f"@at {later}",
                    "Nats-Schedule-Target": s.of(s.TIMER_FIRED, f"{sid}-cancel"),
                },
            )
            assert (await js.get_last_msg(t.STREAM_TIMERS, other)).subject == other
            await js.purge_stream(t.STREAM_TIMERS, subject=other)

        # Feed each durable it binds (the scheduler's timer durable is fed by its own schedule).
        async with admin(provisioned) as js:
            for durable in job.binds:
                if durable is t.SCHEDULER_FIRED:
                    continue
                await js.publish(
                    durable.filters[0].replace("*", sid), b'{"sandbox_id": "%s"}' % sid.encode()
                )

            async def all_delivered() -> bool:
                return all(sid in got[d.name] for d in job.binds)

            await eventually(all_delivered)

            async def all_acked() -> bool:
                for d in job.binds:
                    info = await js.consumer_info(d.stream, d.name)
                    if info.num_ack_pending or info.num_pending:
                        return False
                return True

            await eventually(all_acked)
    finally:
        await broker.stop()
    assert errors.violations() == [], f"{service} hit permission errors: {errors.violations()}"


@pytest.mark.parametrize("service", SERVICES)
async def test_service_cannot_leave_its_lane(provisioned: AuthNats, service: str) -> None:
    async with connect(provisioned, service, inbox_prefix=f"_INBOX_{service}") as (nc, errors):
        for subject in FORBIDDEN[service]:
            await nc.publish(subject, b"{}")
            await errors.wait_violation(subject)
        # Nobody but the owner may read a service's replies.
        other = "platform" if service != "api" else "proxy"
        await nc.subscribe(f"_INBOX_{other}.>")
        await errors.wait_violation(f"_INBOX_{other}")


# ------------------------------------------------------------------ the platform user


async def test_platform_publishes_a_pause_command_and_reads_events(provisioned: AuthNats) -> None:
    sid = "platform-ok"
    async with admin(provisioned) as js_admin:
        await js_admin.publish(s.of(s.EVT_PAUSED, sid), b'{"sandbox_id": "platform-ok"}')
    async with connect(provisioned, "platform") as (nc, errors):
        js = nc.jetstream()
        ack = await js.publish(
            s.of(s.CMD_PAUSE, sid), Probe(sandbox_id=sid).model_dump_json().encode()
        )
        assert ack.stream == t.STREAM_CMD
        # Its own durable consumer on the event stream (any name but a service's).
        await js.add_consumer(
            t.STREAM_EVT,
            ConsumerConfig(
                name="billing-audit",
                durable_name="billing-audit",
                filter_subject=s.of(s.EVT_PAUSED, sid),
            ),
        )
        sub = await js.pull_subscribe_bind("billing-audit", t.STREAM_EVT)
        msgs = await sub.fetch(1, timeout=5)
        assert msgs[0].subject == s.of(s.EVT_PAUSED, sid)
        await msgs[0].ack()
        # And an ephemeral pull reader (nats-py names it, so the name is in the subject).
        ephemeral = await js.pull_subscribe(s.of(s.EVT_PAUSED, sid), stream=t.STREAM_EVT)
        msgs = await ephemeral.fetch(1, timeout=5)
        assert msgs[0].subject == s.of(s.EVT_PAUSED, sid)
        await ephemeral.unsubscribe()
        assert errors.violations() == []
    async with admin(provisioned) as js_admin:
        stored = await js_admin.get_last_msg(t.STREAM_CMD, s.of(s.CMD_PAUSE, sid))
        assert Probe.model_validate_json(stored.data).sandbox_id == sid


async def test_platform_cannot_write_the_kv_bucket(provisioned: AuthNats) -> None:
    sid = "platform-kv"
    async with admin(provisioned) as js_admin:
        store = KvSandboxStore(await js_admin.key_value(t.KV_SANDBOXES))
        await store.create(record(sid))
    async with connect(provisioned, "platform") as (nc, errors):
        js = nc.jetstream()
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.publish(f"$KV.{t.KV_SANDBOXES}.{sid}", b'{"state": "killed"}', timeout=1)
        await errors.wait_violation(f"$KV.{t.KV_SANDBOXES}.{sid}")
        with pytest.raises((nats.errors.TimeoutError, nats.errors.NoRespondersError)):
            await js.key_value(t.KV_SANDBOXES)  # not even a KV handle
        await errors.wait_violation(f"$JS.API.STREAM.INFO.KV_{t.KV_SANDBOXES}")
        for bucket in (t.KV_API_KEYS, t.KV_USERS):
            await nc.publish(f"$KV.{bucket}.mallory", b"x")
            await errors.wait_violation(f"$KV.{bucket}.mallory")
    async with admin(provisioned) as js_admin:
        after = await KvSandboxStore(await js_admin.key_value(t.KV_SANDBOXES)).get(sid)
        assert after is not None
        assert after.state.value == "running"


async def test_platform_cannot_consume_a_service_queue(provisioned: AuthNats) -> None:
    sid = "platform-steal"
    async with connect(provisioned, "platform") as (nc, errors):
        js = nc.jetstream()
        await js.publish(s.of(s.CMD_PAUSE, sid), b'{"sandbox_id": "platform-steal"}')
        # Pull from the snapshotter's work-queue durable: denied.
        sub = await js.pull_subscribe_bind("snapshotter-pause", t.STREAM_CMD)
        with pytest.raises(nats.errors.TimeoutError):
            await sub.fetch(1, timeout=1)
        await errors.wait_violation(f"$JS.API.CONSUMER.MSG.NEXT.{t.STREAM_CMD}.snapshotter-pause")
        # Pull from a service's durable on the event stream: denied too.
        sub = await js.pull_subscribe_bind("scheduler-lifecycle", t.STREAM_EVT)
        with pytest.raises(nats.errors.TimeoutError):
            await sub.fetch(1, timeout=1)
        await errors.wait_violation(f"$JS.API.CONSUMER.MSG.NEXT.{t.STREAM_EVT}.scheduler-lifecycle")
        # Any consumer of its own on the work queue: denied.
        with pytest.raises(nats.errors.TimeoutError):
            await js.add_consumer(
                t.STREAM_CMD, ConsumerConfig(name="mine", durable_name="mine"), timeout=1
            )
        await errors.wait_violation(f"$JS.API.CONSUMER.CREATE.{t.STREAM_CMD}")
        # Re-configuring a service's durable (e.g. narrowing its filter): denied.
        with pytest.raises(nats.errors.TimeoutError):
            await js.add_consumer(
                t.STREAM_EVT,
                ConsumerConfig(name="scheduler-lifecycle", durable_name="scheduler-lifecycle"),
                timeout=1,
            )
        await errors.wait_violation(f"$JS.API.CONSUMER.CREATE.{t.STREAM_EVT}.scheduler-lifecycle")
        # The name-less create takes the name from the body and would REPLACE the durable.
        body = {
            "stream_name": t.STREAM_EVT,
            "config": {"name": "scheduler-lifecycle", "ack_policy": "explicit"},
        }
        with pytest.raises(nats.errors.TimeoutError):
            await nc.request(
                f"$JS.API.CONSUMER.CREATE.{t.STREAM_EVT}", json.dumps(body).encode(), timeout=1
            )
        await errors.wait_violation(f'"$JS.API.CONSUMER.CREATE.{t.STREAM_EVT}"')
        # Acking on a service's behalf: denied.
        await nc.publish(f"$JS.ACK.{t.STREAM_CMD}.snapshotter-pause.1.1.1.1.0", b"+ACK")
        await errors.wait_violation(f"$JS.ACK.{t.STREAM_CMD}.snapshotter-pause")
    # The command is still queued for the snapshotter, and its durables are untouched.
    async with admin(provisioned) as js_admin:
        info = await js_admin.consumer_info(t.STREAM_EVT, "scheduler-lifecycle")
        assert info.config.durable_name == "scheduler-lifecycle"
        assert info.config.filter_subjects == list(t.SCHEDULER_LIFECYCLE.filters)
        stored = await js_admin.get_last_msg(t.STREAM_CMD, s.of(s.CMD_PAUSE, sid))
        assert stored.data


async def test_a_missing_permission_fails_at_once_in_one_readable_line(
    provisioned: AuthNats,
) -> None:
    """A service whose user may not bind a bucket (an auth.conf older than the code) says so in
    one line at the first refusal, rather than asking again for a minute as it does while the
    bus restarts (NATS answers neither: the refusal comes apart from the request)."""
    settings = BusSettings(nats_url=provisioned.url("scheduler"), bus_provision=False)
    broker = make_broker(settings, service="scheduler")
    await prepare(broker, settings)
    try:
        started = time.monotonic()
        with pytest.raises(ConfigError) as refused:
            await key_value(broker, t.KV_API_KEYS)
        assert time.monotonic() - started < ANSWER_WITHIN / 4
        line = str(refused.value)
        assert "\n" not in line and "permissions violation" in line.lower()
        assert line.startswith(f"bind {t.KV_API_KEYS}: the bus refused")
        assert password("scheduler") not in line
        # Its own bucket still binds: the refusal named one call, not the connection.
        assert await key_value(broker, t.KV_SANDBOXES, within=5) is not None
    finally:
        await broker.stop()


async def test_platform_cannot_do_anything_else(provisioned: AuthNats) -> None:
    async with connect(provisioned, "platform") as (nc, errors):
        for subject in (
            "sandbox.evt.paused.forged",  # events are torpor's facts
            "sandbox.sched.timeout.x",  # timers
            "sandbox.timer.fired.x",
            "sandbox.dlq.x",
            f"$JS.API.STREAM.DELETE.{t.STREAM_EVT}",
            f"$JS.API.STREAM.PURGE.{t.STREAM_CMD}",
        ):
            await nc.publish(subject, b"{}")
            await errors.wait_violation(subject)
        await nc.subscribe("_INBOX_api.>")  # the api's replies (KV reads of keys, records)
        await errors.wait_violation("_INBOX_api")


def test_every_durable_is_pulled_by_exactly_its_owning_service() -> None:
    """A durable added to the topology without a user that may pull it would sit unconsumed in
    production; its name prefix is also the inbox prefix ``subscriber_args`` uses."""
    users = {u.name: u for u in load_generator().users()}
    for durable in t.DURABLES:
        pull = f"$JS.API.CONSUMER.MSG.NEXT.{durable.stream}.{durable.name}"
        owners = [n for n, u in users.items() if pull in u.publish and n != "admin"]
        assert owners == [durable.name.split("-", 1)[0]], (durable.name, owners)
