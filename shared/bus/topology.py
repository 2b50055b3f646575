"""Streams, consumers and KV buckets, created idempotently at start-up by every service.

One definition, here; FastStream subscribers bind with ``declare=False`` so no service can
overwrite a stream's config with defaults (FastStream's ``JStream("X")`` with default arguments
replaces an existing stream's config, with only a warning). Existing consumers are
updated in place with ``add_consumer`` (create-or-update), since binding ignores new config.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from functools import partial

from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    ObjectStoreConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)
from nats.js.client import JetStreamContext
from nats.js.errors import BadRequestError

from shared.bus import subjects as s
from shared.bus.retry import DEFAULT, RetryPolicy
from shared.models.public_events import FACT_TYPES

STREAM_CMD = "SANDBOX_CMD"
STREAM_EVT = "SANDBOX_EVT"
STREAM_TIMERS = "SANDBOX_TIMERS"
STREAM_DLQ = "SANDBOX_DLQ"
STREAM_WEBHOOKS = "WEBHOOK_DELIVERIES"

KV_SANDBOXES = "sandboxes"
KV_USERS = "torpor_users"
KV_API_KEYS = "torpor_api_keys"
# The local runtime's workload records (shared/runtime/local): only on one machine (`torpor up`).
KV_WORKLOADS = "torpor_workloads"
KV_SESSIONS = "torpor_dashboard_sessions"  # dashboard sign-ins; the TTL ends them
KV_RATES = "torpor_rates"  # rate-limit token buckets per (action, user); idle ones expire
KV_SNAPSHOTS = "torpor_snapshots"  # stored snapshots (create_snapshot, fork); CAS writes only
KV_WEBHOOKS = "torpor_webhooks"  # webhook registrations, <owner token>.<webhook id>
KV_DELIVERIES = "torpor_webhook_deliveries"  # delivery history per (webhook, event); TTL 7 days
KV_USAGE = "torpor_usage"  # the usage ledger: <owner token>.<sandbox id>, CAS writes only
# Kept files of sandboxes whose pods lose their disk (Kubernetes ``persist: store``) and of
# stored snapshots there: tars named ``sandbox.<id>`` / ``snapshot.<id>`` (shared.bus.kept_files).
OBJ_KEPT_FILES = "torpor_kept_files"
DEFAULT_KEPT_FILES_MAX_BYTES = 256 * 1024**2
KV_TEMPLATES = "torpor_templates"  # templates users build, their builds and names; CAS writes

DAY = 86400


def streams(replicas: int) -> list[StreamConfig]:
    return [
        StreamConfig(
            name=STREAM_CMD,
            description="torpor commands (work queue; one owning consumer per verb)",
            subjects=[f"{s.CMD_PREFIX}.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            num_replicas=replicas,
            duplicate_window=600,
            max_age=DAY,
            max_msg_size=65536,
        ),
        StreamConfig(
            name=STREAM_EVT,
            description="torpor events (fan-out, kept 7 days)",
            subjects=[f"{s.EVT_PREFIX}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=replicas,
            duplicate_window=600,
            max_age=7 * DAY,
        ),
        StreamConfig(
            name=STREAM_TIMERS,
            description="torpor durable timers (NATS message schedules)",
            subjects=["sandbox.sched.>", "sandbox.timer.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=replicas,
            allow_msg_schedules=True,
            allow_msg_ttl=True,
            allow_atomic=True,  # the scheduler arms in atomic batches (shared/bus/timers.py)
            max_age=0,  # a max_age below the longest timeout silently drops schedules
            max_msgs_per_subject=1,
            duplicate_window=600,
        ),
        StreamConfig(
            name=STREAM_WEBHOOKS,
            description="webhook deliveries: one job per (event, webhook) until delivered",
            subjects=[f"{s.WEBHOOK_DELIVERY}.>"],
            retention=RetentionPolicy.WORK_QUEUE,
            storage=StorageType.FILE,
            num_replicas=replicas,
            duplicate_window=3600,  # the fan-out of a redelivered event is one job
            max_age=7 * DAY,
            max_msg_size=256 * 1024,
        ),
        StreamConfig(
            name=STREAM_DLQ,
            description="torpor dead letters: the original message plus the error",
            subjects=[f"{s.DLQ_PREFIX}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=StorageType.FILE,
            num_replicas=replicas,
            max_age=14 * DAY,
            duplicate_window=600,
        ),
    ]


@dataclass(frozen=True)
class Durable:
    stream: str
    name: str
    filters: tuple[str, ...]
    retry: RetryPolicy = DEFAULT
    max_ack_pending: int = 256

    def config(self) -> ConsumerConfig:
        return ConsumerConfig(
            durable_name=self.name,
            ack_policy=AckPolicy.EXPLICIT,
            deliver_policy=DeliverPolicy.ALL,
            ack_wait=self.retry.ack_wait,
            # No consumer ``backoff`` list: with one set, nats-server 2.15 ignores the delay of
            # every NAK after the first (observed: NAK(delay=4s) on delivery 2 redelivered at
            # +34s), which breaks the retry middleware's exponential delays. Crash/hang
            # redeliveries come after ``ack_wait``; retries are paced by the middleware.
            backoff=None,
            max_deliver=self.retry.max_deliver,
            max_ack_pending=self.max_ack_pending,
            filter_subjects=list(self.filters),
        )


# The scheduler's handlers are short (no pods to wait for): a hung one is redelivered sooner.
SCHEDULER_RETRY = RetryPolicy(ack_wait=10, max_deliver=10)
# The scheduler pulls in batches (up to 1000, 2 in flight) per replica: room for a few replicas.
SCHEDULER_ACK_PENDING = 8192

SNAPSHOTTER_PAUSE = Durable(STREAM_CMD, "snapshotter-pause", (s.all_of(s.CMD_PAUSE),))
SNAPSHOTTER_SNAPSHOTS = Durable(
    STREAM_CMD,
    "snapshotter-snapshots",
    (s.all_of(s.CMD_SNAPSHOT), s.all_of(s.CMD_SNAPSHOT_DELETE)),
)
SNAPSHOTTER_EXPIRY = Durable(
    STREAM_TIMERS,
    "snapshotter-expiry",
    (s.all_of(s.TIMER_SNAPSHOT_EXPIRED),),
    retry=SCHEDULER_RETRY,  # a short handler, like the scheduler's timers
)
SCALER_LIFECYCLE = Durable(
    STREAM_CMD,
    "scaler-lifecycle",
    (
        s.all_of(s.CMD_CREATE),
        s.all_of(s.CMD_RESUME),
        s.all_of(s.CMD_KILL),
        s.all_of(s.CMD_NETWORK),
    ),
)
SCALER_ON_SNAPSHOTTED = Durable(STREAM_EVT, "scaler-on-snapshotted", (s.all_of(s.EVT_SNAPSHOTTED),))
SCHEDULER_LIFECYCLE = Durable(
    STREAM_EVT,
    "scheduler-lifecycle",
    tuple(
        s.all_of(p)
        for p in (
            s.EVT_CREATED,
            s.EVT_RESUMED,
            s.EVT_TIMEOUT_SET,
            s.EVT_PAUSED,
            s.EVT_KILLED,
            s.EVT_ACTIVITY,
            s.EVT_FAILED,
        )
    ),
    retry=SCHEDULER_RETRY,
    max_ack_pending=SCHEDULER_ACK_PENDING,
)
SCHEDULER_FIRED = Durable(
    STREAM_TIMERS,
    "scheduler-fired",
    (s.all_of(s.TIMER_FIRED),),
    retry=SCHEDULER_RETRY,
    max_ack_pending=SCHEDULER_ACK_PENDING,
)
# A build runs for minutes: the handler sends heartbeats; a crashed builder's build comes back
# after ack_wait, and a build is never retried after it started (the record says so).
BUILDER_RETRY = RetryPolicy(ack_wait=60, max_deliver=3, give_up_after=2, dead_letter_after=3)
BUILDER_BUILDS = Durable(
    STREAM_CMD,
    "builder-builds",
    (s.all_of(s.CMD_TEMPLATE_BUILD),),
    retry=BUILDER_RETRY,
    max_ack_pending=64,
)

# Webhooks (services/deliverer): the public lifecycle facts (shared.models.public_events), so a
# fact made public there is delivered too.
PUBLIC_FACTS = tuple(f"{s.EVT_PREFIX}.{fact}" for fact in FACT_TYPES)
DELIVERER_EVENTS = Durable(STREAM_EVT, "deliverer-events", tuple(s.all_of(p) for p in PUBLIC_FACTS))
# Attempts are counted and dead-lettered by the deliverer itself (TORPOR_DELIVERER_MAX_ATTEMPTS,
# at most 20); these limits are the middleware's for failures of its own (KV unreachable...).
DELIVERER_SEND = Durable(
    STREAM_WEBHOOKS,
    "deliverer-send",
    (s.all_of(s.WEBHOOK_DELIVERY),),
    retry=RetryPolicy(ack_wait=60, dead_letter_after=24, max_deliver=26, max_delay=600),
)

# The usage ledger (services/ledger): one message in flight, so events apply in stream order.
LEDGER_EVENTS = Durable(
    STREAM_EVT,
    "ledger-events",
    tuple(
        s.all_of(p)
        for p in (s.EVT_CREATED, s.EVT_PAUSED, s.EVT_RESUMED, s.EVT_KILLED, s.EVT_FAILED)
    ),
    max_ack_pending=1,
)

DURABLES = (
    SNAPSHOTTER_PAUSE,
    SNAPSHOTTER_SNAPSHOTS,
    SNAPSHOTTER_EXPIRY,
    SCALER_LIFECYCLE,
    SCALER_ON_SNAPSHOTTED,
    SCHEDULER_LIFECYCLE,
    SCHEDULER_FIRED,
    DELIVERER_EVENTS,
    DELIVERER_SEND,
    LEDGER_EVENTS,
    BUILDER_BUILDS,
)
_RETRY_BY_DURABLE = {d.name: d.retry for d in DURABLES}


def retry_policy_of(durable_name: str | None) -> RetryPolicy:
    """The retry policy of the durable a message came through (the default for any other)."""
    return _RETRY_BY_DURABLE.get(durable_name or "", DEFAULT)


def kv_buckets(replicas: int) -> list[KeyValueConfig]:
    # Every bucket of the control plane: file storage, the bus's replicas.
    file_backed = KeyValueConfig(bucket="", replicas=replicas, storage=StorageType.FILE)
    return [
        replace(
            file_backed,
            bucket=KV_SANDBOXES,
            description="one record per sandbox; compare-and-set writes only",
            history=10,
            max_value_size=256 * 1024,
        ),
        replace(
            file_backed,
            bucket=KV_SNAPSHOTS,
            description="one record per stored snapshot; compare-and-set writes only",
            history=5,
            max_value_size=256 * 1024,
        ),
        replace(
            file_backed,
            bucket=KV_TEMPLATES,
            description="templates users build, their builds (with logs) and names; CAS writes",
            history=5,
            max_value_size=1024 * 1024,
        ),
        replace(file_backed, bucket=KV_USERS, history=5),
        replace(file_backed, bucket=KV_API_KEYS, history=5),
        replace(
            file_backed,
            bucket=KV_WEBHOOKS,
            description="webhook registrations (with their signing secrets)",
            history=1,
            max_value_size=16 * 1024,
        ),
        replace(
            file_backed,
            bucket=KV_DELIVERIES,
            description="webhook delivery history, one entry per (webhook, event)",
            history=1,
            ttl=7 * DAY,
            max_value_size=16 * 1024,
        ),
        replace(
            file_backed,
            bucket=KV_USAGE,
            description="usage ledger: one record per sandbox; compare-and-set writes only",
            history=1,
            max_value_size=64 * 1024,
        ),
        replace(
            file_backed,
            bucket=KV_SESSIONS,
            description="dashboard sessions by sha256(session id); the TTL ends them",
            history=1,
            ttl=12 * 3600,  # services/api/dashboard/sessions.py: SESSION_SECONDS
        ),
        replace(
            file_backed,
            bucket=KV_RATES,
            description="rate-limit token buckets (compare-and-set); a full bucket expires",
            history=1,
            ttl=3600,
        ),
    ]


def workloads_bucket(replicas: int = 1) -> KeyValueConfig:
    """The local runtime's bucket; created by whoever provisions a local-runtime bus (its
    services' NATS users may not create buckets)."""
    return KeyValueConfig(bucket=KV_WORKLOADS, history=5, replicas=replicas)


_STREAM_EXISTS_DIFFERENT = 10058


async def _create_or_converge(
    create: Awaitable[object], converge: Callable[[], Awaitable[object]] | None = None
) -> None:
    """Create a stream (or a bucket, a store); when it exists with a different config, keep it
    and run ``converge`` (if any) to bring it in line."""
    try:
        await create
    except BadRequestError as e:
        if e.err_code != _STREAM_EXISTS_DIFFERENT:
            raise
        if converge is not None:
            await converge()


async def ensure_workloads_bucket(js: JetStreamContext) -> None:
    await _create_or_converge(js.create_key_value(workloads_bucket()))


async def ensure_topology(
    js: JetStreamContext,
    *,
    replicas: int = 1,
    kept_files_max_bytes: int = DEFAULT_KEPT_FILES_MAX_BYTES,
) -> None:
    """Create or converge every stream, KV bucket, object store and durable. Safe to call from
    every replica."""
    for cfg in streams(replicas):
        await _create_or_converge(js.add_stream(cfg), partial(js.update_stream, cfg))
    for kv in kv_buckets(replicas):
        await _create_or_converge(js.create_key_value(kv), partial(_converge_bucket, js, kv))
    await ensure_kept_files(js, replicas=replicas, max_bytes=kept_files_max_bytes)
    for durable in DURABLES:
        await js.add_consumer(durable.stream, durable.config())


async def _converge_bucket(js: JetStreamContext, kv: KeyValueConfig) -> None:
    # KV streams are named KV_<bucket>; keep our limits and description on drift.
    info = await js.stream_info(f"KV_{kv.bucket}")
    await js.update_stream(
        replace(info.config, description=kv.description, max_msgs_per_subject=kv.history)
    )


async def ensure_kept_files(js: JetStreamContext, *, replicas: int, max_bytes: int) -> None:
    """The kept-files object store, its size bound kept on drift (a full bucket refuses new
    objects: ``discard: new``, so a pause fails rather than dropping another sandbox's files)."""
    config = ObjectStoreConfig(
        bucket=OBJ_KEPT_FILES,
        description="torpor: kept files (Kubernetes persist: store) and snapshot files",
        max_bytes=max_bytes,
        replicas=replicas,
        storage=StorageType.FILE,
    )

    async def converge() -> None:
        info = await js.stream_info(f"OBJ_{OBJ_KEPT_FILES}")
        await js.update_stream(replace(info.config, max_bytes=max_bytes))

    await _create_or_converge(js.create_object_store(OBJ_KEPT_FILES, config), converge)
