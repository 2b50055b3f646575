"""Commands and events on the bus. Versioned in the payload (``schema_version``), additive changes
only; consumers ignore unknown fields. Headers carry ``correlation_id`` and ``causation_id``.

Message ids (``Nats-Msg-Id``) are derived from the sandbox id and generation (see ``msg_id``) so a
user's pause and a timeout's pause for the same generation deduplicate against each other.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from shared.models.lifecycle import HookOutcome
from shared.redaction import redact_text


class _Message(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    schema_version: Literal[1] = 1
    sandbox_id: str = Field(pattern=r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")


# ---- commands ------------------------------------------------------------------------------


class CreateSandbox(_Message):
    """No env values here (they are often secrets): the scaler reads them from the record, which
    the ``platform`` user cannot read. An ``envs`` field sent by an older publisher is ignored."""

    type: Literal["sandbox.cmd.create"] = "sandbox.cmd.create"
    owner: str
    template: str = "sandbox-base"
    timeout: int = Field(default=300, ge=1)
    auto_pause: bool = False
    auto_resume: bool = False
    metadata: dict[str, str] = Field(default_factory=dict)


class PauseSandbox(_Message):
    type: Literal["sandbox.cmd.pause"] = "sandbox.cmd.pause"
    generation: int
    reason: Literal["user", "timeout", "platform"] = "user"
    # E2B's pause ``memory: true``: keep the processes' memory where the runtime can (the
    # snapshotter sets ``torpor.dev/pause-memory`` on the workload); false: files only.
    memory: bool = False


class ResumeSandbox(_Message):
    type: Literal["sandbox.cmd.resume"] = "sandbox.cmd.resume"
    generation: int
    timeout: int | None = Field(default=None, ge=1)  # new inactivity timeout, if given
    auto_pause: bool | None = None  # whether it pauses on timeout from now on, if given
    # False: boot from the kept files even if the pause kept memory (E2B's reboot); the
    # scaler sets ``torpor.dev/resume-memory`` for the runtime. None/True: restore it.
    memory: bool | None = None
    reason: Literal["user", "auto", "platform"] = "user"


class SetSandboxNetwork(_Message):
    """Apply the record's current network policy to the sandbox's workload (live, and kept for
    later pods). The policy is read from the record, not carried here: of several updates in
    flight, the last one written wins whichever command runs last."""

    type: Literal["sandbox.cmd.network"] = "sandbox.cmd.network"
    generation: int


class KillSandbox(_Message):
    type: Literal["sandbox.cmd.kill"] = "sandbox.cmd.kill"
    generation: int
    reason: Literal["user", "timeout", "retention", "platform"] = "user"


class TakeSnapshot(_Message):
    """Capture the sandbox into the stored snapshot ``snapshot_id`` (its record, written by the
    publisher in state ``taking``, says who owns it). The sandbox keeps running."""

    type: Literal["sandbox.cmd.snapshot"] = "sandbox.cmd.snapshot"
    snapshot_id: str = Field(pattern=r"^snap-[a-z0-9]{20}$")


class DeleteSnapshot(_Message):
    """Remove a stored snapshot taken of ``sandbox_id`` (files, then its record)."""

    type: Literal["sandbox.cmd.snapshot_delete"] = "sandbox.cmd.snapshot_delete"
    snapshot_id: str = Field(pattern=r"^snap-[a-z0-9]{20}$")
    reason: Literal["user", "retention", "fork", "platform"] = "user"


# ---- events --------------------------------------------------------------------------------


class _Event(_Message):
    generation: int
    at: datetime


class ProcessOutcome(BaseModel):
    model_config = ConfigDict(frozen=True)

    cmd: str
    args: list[str]
    tag: str | None = None
    old_pid: int
    new_pid: int | None = None
    error: str | None = None

    @field_validator("error")
    @classmethod
    def _no_secret_in_error(cls, value: str | None) -> str | None:
        return None if value is None else redact_text(value)[:500]


# How a sandbox got its pod: claimed from its template's warm pool, or started for it.
StartPath = Literal["warm", "cold"]


class ResumeTimings(BaseModel):
    """Where a resume's time went, in milliseconds (phases in order; ``total_ms`` from the
    command's claim to the record's commit). ``files_ms`` is 0 when the files were kept in place
    (the layer or claim is mounted with the pod, inside ``pod_ms``)."""

    model_config = ConfigDict(frozen=True)

    claim_ms: float = 0.0
    pod_ms: float = 0.0  # scale to 1 and wait for the pod (daemon healthy)
    files_ms: float = 0.0
    replay_ms: float = 0.0  # list what runs, start what is missing
    hooks_ms: float = 0.0  # the postResume hooks
    total_ms: float = 0.0


REPORT_PROCESS_BYTES = 32 * 1024


class ResumeReport(BaseModel):
    """What a resume restored: each snapshot process (old and new pid, or its error), whether the
    sandbox's files were kept, the template (and its version) the new pod runs, and the time."""

    model_config = ConfigDict(frozen=True)

    at: datetime
    path: StartPath = "cold"  # the pod: claimed from a warm pool, or started for this resume
    snapshot_id: str | None = None
    template: str
    template_version: str | None = None  # content digest of the template the pod started from
    files_kept: bool
    # Whether the processes' memory came back. A resume replays each process from its command
    # line, so variables, a kernel's state and open connections are gone: said here, never
    # silently (``memory_note`` says what was lost and why).
    memory_kept: bool = False
    memory_note: str | None = None
    processes: list[ProcessOutcome] = Field(default_factory=list)
    # Processes beyond the report's size budget (``REPORT_PROCESS_BYTES``): counted in
    # ``replayed``/``failed``, not listed. The report lives on the record, which also holds the
    # snapshot (up to 200 KiB) under the bucket's 256 KiB value limit.
    omitted: int = 0
    replayed: int = 0  # processes running again (started now, or found already running)
    failed: int = 0
    timings: ResumeTimings = Field(default_factory=ResumeTimings)
    hooks: list[HookOutcome] = Field(default_factory=list)  # postResume, after the replay


class SandboxCreated(_Event):
    type: Literal["sandbox.evt.created"] = "sandbox.evt.created"
    path: StartPath = "cold"
    # Started from a stored snapshot: its snapshot id and the replayed processes' outcomes.
    origin_snapshot_id: str | None = None
    processes: list[ProcessOutcome] = Field(default_factory=list)


class SandboxSnapshotted(_Event):
    type: Literal["sandbox.evt.snapshotted"] = "sandbox.evt.snapshotted"
    snapshot_id: str
    process_count: int


class SandboxPaused(_Event):
    type: Literal["sandbox.evt.paused"] = "sandbox.evt.paused"
    snapshot_id: str | None = None


class SandboxResumed(_Event):
    type: Literal["sandbox.evt.resumed"] = "sandbox.evt.resumed"
    path: StartPath = "cold"
    processes: list[ProcessOutcome] = Field(default_factory=list)
    report: ResumeReport | None = None  # also on the record (``last_resume``)


class SandboxHookRan(_Event):
    """A lifecycle hook ran (``op``: the transition it belongs to). ``outcome.aborted``: it
    stopped that transition (a refused pause: the sandbox keeps running)."""

    type: Literal["sandbox.evt.hook"] = "sandbox.evt.hook"
    op: Literal["pause", "resume", "kill"]
    outcome: HookOutcome


class SandboxKilled(_Event):
    type: Literal["sandbox.evt.killed"] = "sandbox.evt.killed"


class SandboxFailed(_Event):
    type: Literal["sandbox.evt.failed"] = "sandbox.evt.failed"
    op: str
    reason: str

    @field_validator("reason")
    @classmethod
    def _no_secrets(cls, value: str) -> str:
        # Reasons quote errors (daemon answers, pod log lines) and this event is public.
        return redact_text(value)


class SnapshotTaken(_Event):
    """A stored snapshot of the sandbox is ready (``generation``: the sandbox's at capture)."""

    type: Literal["sandbox.evt.snapshot_taken"] = "sandbox.evt.snapshot_taken"
    snapshot_id: str
    process_count: int


class SnapshotDeleted(_Event):
    type: Literal["sandbox.evt.snapshot_deleted"] = "sandbox.evt.snapshot_deleted"
    snapshot_id: str


class SandboxExpired(_Event):
    type: Literal["sandbox.evt.expired"] = "sandbox.evt.expired"
    decision: Literal["pause", "kill"]
    deadline: datetime
    command: str | None = None  # "<subject> <Nats-Msg-Id>" of the command carrying it out


class SandboxExpiring(_Event):
    """The sandbox will expire (``decision``: paused or killed) at ``deadline`` unless something
    keeps it busy meanwhile; sent ``notice_seconds`` before, when its template asks for it."""

    type: Literal["sandbox.evt.expiring"] = "sandbox.evt.expiring"
    decision: Literal["pause", "kill"]
    deadline: datetime
    notice_seconds: int


class SandboxTimeoutSet(_Event):
    type: Literal["sandbox.evt.timeout_set"] = "sandbox.evt.timeout_set"
    deadline: datetime


class SandboxActivity(_Event):
    """Throttled activity report from the proxy or the api (one per sandbox every few seconds)."""

    type: Literal["sandbox.evt.activity"] = "sandbox.evt.activity"


def address(message: BaseModel, *extra: str, generation: int | None = None) -> tuple[str, str]:
    """The subject and the message id of a command or event, derived from it: its ``type`` is the
    subject's prefix and its last word the id's kind (``PauseSandbox`` of generation 3 goes to
    ``sandbox.cmd.pause.<sid>`` as ``pause:<sid>:g3``). ``generation`` for a message without one
    (``CreateSandbox``: the record's)."""
    kind = str(getattr(message, "type", ""))
    sid = getattr(message, "sandbox_id", None)
    gen = generation if generation is not None else getattr(message, "generation", None)
    if not kind.startswith("sandbox.") or sid is None or gen is None:
        msg = f"{type(message).__name__} has no type, sandbox or generation to address it by"
        raise TypeError(msg)
    return f"{kind}.{sid}", msg_id(kind.rsplit(".", 1)[-1], sid, int(gen), *extra)


def msg_id(kind: str, sandbox_id: str, generation: int, *extra: str) -> str:
    """``msg_id("pause", "sbx1", 3) == "pause:sbx1:g3"``."""
    tail = "".join(f":{e}" for e in extra)
    return f"{kind}:{sandbox_id}:g{generation}{tail}"
