"""Every subject torpor uses: ``<domain>.<kind>.<verb-or-fact>.<sandbox id>`` (id last).

This is a public interface: other platform services publish commands and read events here.
"""

from __future__ import annotations

# Commands (work queue, one owning consumer each).
CMD_PREFIX = "sandbox.cmd"
CMD_CREATE = "sandbox.cmd.create"
CMD_PAUSE = "sandbox.cmd.pause"
CMD_RESUME = "sandbox.cmd.resume"
CMD_KILL = "sandbox.cmd.kill"
CMD_NETWORK = "sandbox.cmd.network"
# Stored snapshots: take one of the sandbox, delete one taken of it (id last: the source sandbox).
CMD_SNAPSHOT = "sandbox.cmd.snapshot"
CMD_SNAPSHOT_DELETE = "sandbox.cmd.snapshot_delete"
# Template builds (E2B's template API): build one (id last: the build id, a uuid).
CMD_TEMPLATE_BUILD = "sandbox.cmd.template_build"

# Events (fan-out, past tense).
EVT_PREFIX = "sandbox.evt"
EVT_CREATED = "sandbox.evt.created"
EVT_SNAPSHOTTED = "sandbox.evt.snapshotted"
EVT_PAUSED = "sandbox.evt.paused"
EVT_RESUMED = "sandbox.evt.resumed"
EVT_KILLED = "sandbox.evt.killed"
EVT_FAILED = "sandbox.evt.failed"
EVT_EXPIRED = "sandbox.evt.expired"
EVT_TIMEOUT_SET = "sandbox.evt.timeout_set"
EVT_ACTIVITY = "sandbox.evt.activity"
EVT_SNAPSHOT_TAKEN = "sandbox.evt.snapshot_taken"
EVT_SNAPSHOT_DELETED = "sandbox.evt.snapshot_deleted"
EVT_HOOK = "sandbox.evt.hook"
EVT_EXPIRING = "sandbox.evt.expiring"

# Durable timers (NATS message schedules): holder and target live in one stream.
SCHED_TIMEOUT = "sandbox.sched.timeout"
TIMER_FIRED = "sandbox.timer.fired"
# A stored snapshot's retention: holder per snapshot id, fired copy per source sandbox id.
SCHED_SNAPSHOT_RETENTION = "sandbox.sched.snapshot_retention"
TIMER_SNAPSHOT_EXPIRED = "sandbox.timer.snapshot_expired"

DLQ_PREFIX = "sandbox.dlq"

# Webhook delivery jobs (one per event and webhook; the webhook id last).
WEBHOOK_DELIVERY = "webhook.delivery"


def of(prefix: str, sandbox_id: str) -> str:
    """``of(CMD_PAUSE, "sbx1") == "sandbox.cmd.pause.sbx1"``."""
    return f"{prefix}.{sandbox_id}"


def all_of(prefix: str) -> str:
    """The filter for one verb across sandboxes: ``sandbox.cmd.pause.*``."""
    return f"{prefix}.*"


def sandbox_id_of(subject: str) -> str:
    return subject.rsplit(".", 1)[-1]


def verb_of(subject: str) -> str:
    """A command's verb, its subject's third token: ``verb_of("sandbox.cmd.pause.sbx1") ==
    "pause"`` ("" for a subject too short to have one)."""
    return subject.split(".")[2] if subject.count(".") >= 3 else ""
