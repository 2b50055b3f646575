"""The bus's permission model: one NATS user per torpor service, least privilege.

ONE definition renders both configs: ``deploy/nats/auth.conf`` (Kubernetes, written by
``deploy/nats/gen_auth.py``) and the ``auth.conf`` the embedded broker of ``torpor up`` includes
(``shared/bus/server.py``). Both are byte-identical: passwords are never in the file, only
nats-server environment references (``$NATS_<USER>_PASSWORD``).

The permissions are derived from the bus topology (``shared/bus/topology.py``: streams, durable
consumers, KV buckets) and the subjects (``shared/bus/subjects.py``), so they cannot drift from
what the services actually bind. ``tests/deploy/test_nats_auth.py`` proves each grant and each
denial on a real nats-server; ``tests/security/test_bus_auth.py`` does it on ``torpor up``.

Inbox isolation: every service connects with the inbox prefix ``_INBOX_<service>``
(``shared.bus.broker.make_broker`` sets it), and may only subscribe below its own prefix, so no
other user (including ``platform``) can read the replies it gets — KV reads, JetStream API answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from shared.bus import subjects as s
from shared.bus import topology as t

API = "$JS.API"


@dataclass(frozen=True)
class User:
    name: str
    doc: str
    publish: tuple[str, ...] = ()
    subscribe: tuple[str, ...] = ()
    deny_publish: tuple[str, ...] = ()
    deny_subscribe: tuple[str, ...] = ()
    inbox_prefix: str = "_INBOX"
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def password_env(self) -> str:
        return f"NATS_{self.name.upper()}_PASSWORD"


# ------------------------------------------------------------------ building blocks


def js_client() -> list[str]:
    """What any JetStream client sends before touching a specific stream."""
    return [f"{API}.INFO"]


def bind_durable(durable: t.Durable) -> list[str]:
    """Pull from one provisioned durable: look it up, fetch, ack/nak/in-progress. No create."""
    return [
        f"{API}.STREAM.INFO.{durable.stream}",
        f"{API}.CONSUMER.INFO.{durable.stream}.{durable.name}",
        f"{API}.CONSUMER.MSG.NEXT.{durable.stream}.{durable.name}",
        f"$JS.ACK.{durable.stream}.{durable.name}.>",
    ]


def kv_read(bucket: str) -> list[str]:
    """get (direct or not), keys and watch (an ordered, ephemeral push consumer)."""
    stream = f"KV_{bucket}"
    return [
        f"{API}.STREAM.INFO.{stream}",
        f"{API}.DIRECT.GET.{stream}",
        f"{API}.DIRECT.GET.{stream}.>",
        f"{API}.STREAM.MSG.GET.{stream}",
        # Ephemeral consumers only: a name-less create cannot carry a durable name.
        f"{API}.CONSUMER.CREATE.{stream}",
        f"{API}.CONSUMER.INFO.{stream}.*",
        f"{API}.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


def kv_write(bucket: str) -> list[str]:
    """put / create / update (CAS) / delete markers: plain JetStream publishes."""
    return [f"$KV.{bucket}.>"]


def object_store(bucket: str) -> list[str]:
    """put (chunks under a fresh subject, then the meta rollup; old chunks purged), get (the
    meta, then the chunks through an ordered consumer, found by subject), delete."""
    stream = f"OBJ_{bucket}"
    return [
        f"$O.{bucket}.>",
        f"{API}.STREAM.INFO.{stream}",
        f"{API}.STREAM.NAMES",
        f"{API}.STREAM.MSG.GET.{stream}",
        f"{API}.DIRECT.GET.{stream}",
        f"{API}.DIRECT.GET.{stream}.>",
        f"{API}.STREAM.PURGE.{stream}",
        f"{API}.CONSUMER.CREATE.{stream}",
        f"{API}.CONSUMER.INFO.{stream}.*",
        f"{API}.CONSUMER.DELETE.{stream}.*",
        f"$JS.FC.{stream}.>",
    ]


def events(*prefixes: str) -> list[str]:
    return [s.all_of(p) for p in prefixes]


def dead_letters() -> list[str]:
    return [f"{s.DLQ_PREFIX}.>"]


def durables_of(*names: str) -> list[t.Durable]:
    by_name = {d.name: d for d in t.DURABLES}
    return [by_name[n] for n in names]


def _flat(*groups: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    for group in groups:
        out.extend(x for x in group if x not in out)
    return tuple(out)


def service(name: str, doc: str, *groups: list[str], subscribe: tuple[str, ...] = ()) -> User:
    prefix = f"_INBOX_{name}"
    return User(
        name=name,
        doc=doc,
        publish=_flat(js_client(), *groups),
        subscribe=(f"{prefix}.>", *subscribe),
        inbox_prefix=prefix,
    )


def events_read() -> list[str]:
    """History of the event stream by subject (the dashboard's events feed)."""
    return [f"{API}.STREAM.INFO.{t.STREAM_EVT}", f"{API}.STREAM.MSG.GET.{t.STREAM_EVT}"]


def local_runtime() -> list[str]:
    """The local runtime's workload records (``torpor up``); the bucket does not exist on
    Kubernetes, where this grant is inert. Kept in both so the two configs are one file."""
    return [*kv_read(t.KV_WORKLOADS), *kv_write(t.KV_WORKLOADS)]


# ------------------------------------------------------------------ the users


def users() -> list[User]:
    admin = User(
        name="admin",
        doc="provisioning Job and operators (torpor keys ...): creates streams, KV and durables",
        publish=(">",),
        subscribe=(">",),
    )
    api = service(
        "api",
        "REST API + dashboard: commands, timeout/activity events, records and snapshots (CAS), "
        "users (read; "
        "quota overrides: write), keys (read), rate buckets and dashboard sessions (write), "
        "the event feed (read)",
        [
            s.all_of(x)
            for x in (
                s.CMD_CREATE,
                s.CMD_PAUSE,
                s.CMD_RESUME,
                s.CMD_KILL,
                s.CMD_NETWORK,
                s.CMD_SNAPSHOT,
                s.CMD_SNAPSHOT_DELETE,
                s.CMD_TEMPLATE_BUILD,
            )
        ],
        events(s.EVT_TIMEOUT_SET, s.EVT_ACTIVITY),
        kv_read(t.KV_TEMPLATES),
        kv_write(t.KV_TEMPLATES),
        kv_read(t.KV_SANDBOXES),
        kv_write(t.KV_SANDBOXES),
        kv_read(t.KV_SNAPSHOTS),
        kv_write(t.KV_SNAPSHOTS),
        kv_read(t.KV_USERS),
        kv_write(t.KV_USERS),
        kv_read(t.KV_API_KEYS),
        kv_read(t.KV_RATES),
        kv_write(t.KV_RATES),
        kv_read(t.KV_SESSIONS),
        kv_write(t.KV_SESSIONS),
        # webhook registrations (their secrets too: created here) and the delivery history
        kv_read(t.KV_WEBHOOKS),
        kv_write(t.KV_WEBHOOKS),
        kv_read(t.KV_DELIVERIES),
        kv_read(t.KV_USAGE),  # the usage API and the dashboard's usage panel
        events_read(),
        # the events API reads the stream through short-lived consumers of its own
        evt_consumers(),
        # the dashboard's live feed: one core subscription (at-most-once is right for a screen)
        subscribe=(f"{s.EVT_PREFIX}.>",),
    )
    api = replace(api, deny_publish=tuple(not_service_durables()))
    proxy = service(
        "proxy",
        "data plane: reads records, auto-resume (resume rate buckets by CAS), activity (moves "
        "the deadline by CAS), key checks",
        [s.all_of(s.CMD_RESUME)],
        events(s.EVT_ACTIVITY, s.EVT_TIMEOUT_SET),
        kv_read(t.KV_SANDBOXES),
        kv_write(t.KV_SANDBOXES),
        kv_read(t.KV_USERS),
        kv_read(t.KV_API_KEYS),
        kv_read(t.KV_RATES),
        kv_write(t.KV_RATES),
    )
    scheduler_durables = durables_of(t.SCHEDULER_LIFECYCLE.name, t.SCHEDULER_FIRED.name)
    scheduler = service(
        "scheduler",
        "deadlines: durable timers, expiry events, pause/kill on expiry, retention",
        [x for d in scheduler_durables for x in bind_durable(d)],
        [s.all_of(s.CMD_PAUSE), s.all_of(s.CMD_KILL)],
        events(s.EVT_EXPIRED, s.EVT_FAILED, s.EVT_EXPIRING),
        ["sandbox.sched.>"],  # schedule holders; the server itself publishes sandbox.timer.>
        # cancel a timer (purge its holder subject), read a pending holder back
        [
            f"{API}.STREAM.PURGE.{t.STREAM_TIMERS}",
            f"{API}.STREAM.MSG.GET.{t.STREAM_TIMERS}",
            f"{API}.DIRECT.GET.{t.STREAM_TIMERS}",
            f"{API}.DIRECT.GET.{t.STREAM_TIMERS}.>",
        ],
        kv_read(t.KV_SANDBOXES),
        kv_write(t.KV_SANDBOXES),
        dead_letters(),
    )
    snapshotter = service(
        "snapshotter",
        "pause: running -> pausing, envd List, snapshot annotation, snapshotted event; stored "
        "snapshots: capture (process list and files), delete; kept files (upload at pause)",
        bind_durable(t.SNAPSHOTTER_PAUSE),
        bind_durable(t.SNAPSHOTTER_SNAPSHOTS),
        bind_durable(t.SNAPSHOTTER_EXPIRY),
        # a stored snapshot's retention timer (the server publishes the fired copy)
        [s.all_of(s.SCHED_SNAPSHOT_RETENTION)],
        local_runtime(),
        events(
            s.EVT_SNAPSHOTTED,
            s.EVT_FAILED,
            s.EVT_SNAPSHOT_TAKEN,
            s.EVT_SNAPSHOT_DELETED,
            s.EVT_HOOK,
        ),
        kv_read(t.KV_SANDBOXES),
        kv_write(t.KV_SANDBOXES),
        kv_read(t.KV_SNAPSHOTS),
        kv_write(t.KV_SNAPSHOTS),
        # Kubernetes kept files: a `persist: store` pause uploads them; snapshot files
        object_store(t.OBJ_KEPT_FILES),
        dead_letters(),
    )
    scaler_durables = durables_of(t.SCALER_LIFECYCLE.name, t.SCALER_ON_SNAPSHOTTED.name)
    scaler = service(
        "scaler",
        "create / scale 0 and 1 / replay / delete workloads; lifecycle events; kept files "
        "(restore, delete)",
        [x for d in scaler_durables for x in bind_durable(d)],
        local_runtime(),
        events(s.EVT_CREATED, s.EVT_PAUSED, s.EVT_RESUMED, s.EVT_KILLED, s.EVT_FAILED, s.EVT_HOOK),
        kv_read(t.KV_SANDBOXES),
        kv_write(t.KV_SANDBOXES),
        # Kubernetes kept files: a resume restores them into the pod, a kill deletes them
        object_store(t.OBJ_KEPT_FILES),
        dead_letters(),
    )
    deliverer = service(
        "deliverer",
        "webhooks: lifecycle events in, one delivery job per webhook, signed HTTP deliveries, "
        "their history and dead letters",
        bind_durable(t.DELIVERER_EVENTS),
        bind_durable(t.DELIVERER_SEND),
        [s.all_of(s.WEBHOOK_DELIVERY)],
        kv_read(t.KV_SANDBOXES),
        kv_read(t.KV_WEBHOOKS),
        kv_read(t.KV_DELIVERIES),
        kv_write(t.KV_DELIVERIES),
        dead_letters(),
    )
    ledger = service(
        "ledger",
        "usage ledger: lifecycle events in, one usage record per sandbox (compare-and-set)",
        bind_durable(t.LEDGER_EVENTS),
        kv_read(t.KV_SANDBOXES),
        kv_read(t.KV_USAGE),
        kv_write(t.KV_USAGE),
        dead_letters(),
    )
    builder = service(
        "builder",
        "template builds: build records (CAS, logs), build pods (the local runtime's workloads); "
        "sandbox and snapshot records (read: which templates the garbage collection keeps)",
        bind_durable(t.BUILDER_BUILDS),
        local_runtime(),
        kv_read(t.KV_TEMPLATES),
        kv_write(t.KV_TEMPLATES),
        kv_read(t.KV_SANDBOXES),
        kv_read(t.KV_SNAPSHOTS),
        dead_letters(),
    )
    return [
        admin,
        api,
        proxy,
        scheduler,
        snapshotter,
        scaler,
        deliverer,
        ledger,
        builder,
        platform(),
    ]


def platform() -> User:
    """Other platform services: publish torpor's commands, read its events; nothing else.

    They may make their own consumers on SANDBOX_EVT (ephemeral or durable with any name) but
    never touch a service's durable: that would steal or re-ack its messages. No KV, no timers,
    no DLQ, no consumer at all on the SANDBOX_CMD work queue.
    """
    evt = t.STREAM_EVT
    return User(
        name="platform",
        doc="other platform services: publish sandbox.cmd.>, read sandbox.evt.>",
        publish=(
            f"{API}.INFO",
            f"{s.CMD_PREFIX}.>",
            f"{API}.STREAM.NAMES",  # clients look the stream up by subject (names only)
            f"{API}.STREAM.INFO.{evt}",
            f"{API}.STREAM.MSG.GET.{evt}",
            f"{API}.DIRECT.GET.{evt}",
            f"{API}.DIRECT.GET.{evt}.>",
            *evt_consumers(),
        ),
        subscribe=("_INBOX.>", f"{s.EVT_PREFIX}.>"),
        deny_publish=tuple(not_service_durables()),
    )


def evt_consumers() -> list[str]:
    """Consumers of one's own on SANDBOX_EVT (any name; with ``not_service_durables``)."""
    evt = t.STREAM_EVT
    return [
        # Only creates with the name in the subject: the name-less form takes the name
        # from the body and can REPLACE a service's durable (observed on 2.15.1).
        f"{API}.CONSUMER.CREATE.{evt}.>",
        f"{API}.CONSUMER.INFO.{evt}.*",
        f"{API}.CONSUMER.DELETE.{evt}.*",
        f"{API}.CONSUMER.MSG.NEXT.{evt}.*",
        f"$JS.ACK.{evt}.>",
        f"$JS.FC.{evt}.>",
    ]


def not_service_durables() -> list[str]:
    """Denials that keep ``evt_consumers`` off every service's durable on SANDBOX_EVT: no
    stealing, re-acking or replacing them."""
    evt = t.STREAM_EVT
    deny: list[str] = []
    for d in (d for d in t.DURABLES if d.stream == evt):
        deny += [
            f"{API}.CONSUMER.*.{evt}.{d.name}",
            f"{API}.CONSUMER.*.{evt}.{d.name}.>",
            f"{API}.CONSUMER.MSG.NEXT.{evt}.{d.name}",
            f"{API}.CONSUMER.DURABLE.CREATE.{evt}.{d.name}",
            f"$JS.ACK.{evt}.{d.name}.>",
        ]
    return deny


# ------------------------------------------------------------------ rendering


def _list(key: str, items: tuple[str, ...], indent: str) -> list[str]:
    if not items:
        return []
    return [f"{indent}{key}: [", *(f'{indent}  "{x}"' for x in items), f"{indent}]"]


def env_reference(user: User) -> str:
    """The password as a nats-server environment reference: the file itself holds no secret."""
    return f"${user.password_env}"


def render(all_users: list[User], password: Callable[[User], str] = env_reference) -> str:
    lines = [
        "# GENERATED by shared/bus/permissions.py from shared/bus/{topology,subjects}.py: do not edit.",  # noqa: E501
        "# One user per torpor service, least privilege. Passwords come from the environment",
        "# (the torpor-nats-auth Secret, or torpor up's credentials); nothing secret is in this file.",  # noqa: E501
        "authorization {",
        "  users: [",
    ]
    for u in all_users:
        inbox = f" Inbox prefix {u.inbox_prefix}." if u.inbox_prefix != "_INBOX" else ""
        lines += [
            f"    # {u.name}: {u.doc}.{inbox}",
            "    {",
            f"      user: {u.name}",
            f"      password: {password(u)}",
            "      permissions: {",
            "        publish: {",
            *_list("allow", u.publish, " " * 10),
            *_list("deny", u.deny_publish, " " * 10),
            "        }",
            "        subscribe: {",
            *_list("allow", u.subscribe, " " * 10),
            *_list("deny", u.deny_subscribe, " " * 10),
            "        }",
            "      }",
            "    }",
        ]
    lines += ["  ]", "}", ""]
    return "\n".join(lines)
