"""Workload records of the local runtime, kept in a NATS KV bucket and changed only by CAS.

Key ``wl.<name>`` holds one :class:`WorkloadRecord` (the bucket also holds the address
reservations of :mod:`.addresses`). The KV revision of ``wl.<name>`` is the workload's
``resource_version``.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Callable
from typing import Literal

from nats.js.errors import (
    BadRequestError,
    BucketNotFoundError,
    InvalidKeyError,
    KeyNotFoundError,
    KeyWrongLastSequenceError,
)
from nats.js.kv import KeyValue
from pydantic import BaseModel, ConfigDict, Field

from shared.bus.kv import key_names
from shared.errors import Conflict, NotFound
from shared.models.network import OPEN, NetworkPolicy

WORKLOAD_PREFIX = "wl."


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Claim(_Frozen):
    """A warm pod taken from a pool (see .pools): where it came from and how far its binding to
    the sandbox got. The pod serves nothing of the sandbox before ``bound``."""

    pool: str  # the pool workload the pod was started for
    secret: str  # that pool pod's one-time daemon token, replaced by the sandbox's at binding
    old_address: str | None = None  # the sandbox's own before the claim: released at binding
    old_id_base: int | None = None
    # The sandbox had no kept layer at claim: it takes the pod's fresh one (else the pod's root
    # becomes its kept layer).
    fresh: bool = True
    # Who binds it, until when: one runtime at a time; another takes over after the lease (its
    # binder died). Binding is repeatable, so a takeover finishes the job.
    binder: str = ""
    lease_until: float = 0.0
    bound: bool = False


class Pool(_Frozen):
    """On a pool workload (a warm pod of ``template`` waiting for a sandbox)."""

    template: str
    claimed_by: str | None = None  # the sandbox whose claim took the pod (a CAS: one winner)
    claimed_at: float = 0.0  # wall clock


class PodRecord(_Frozen):
    """One started pod: the outer bwrap process and its private workspace."""

    uid: str
    pid: int
    started_at: float  # wall clock, for humans and logs
    pod_dir: str  # host dir holding workspace/ and pod.log; removed when the pod stops
    ready: bool = False  # the daemon answered /health once
    start_ticks: int | None = None  # the outer bwrap's start time: with pid, its identity
    address: str | None = None  # its address in the pod network (None: older records)
    claim: Claim | None = None  # a warm pod from a pool (None: started for this workload)
    template_version: str | None = None  # what it was started from (templates.template_version)
    # Restored from its sandbox's memory checkpoint (.memory) rather than started; else why the
    # memory a pause kept (or tried to) did not come back, for the resume report.
    memory_kept: bool = False
    memory_note: str | None = None


class WorkloadRecord(_Frozen):
    version: Literal[1] = 1
    name: str
    template: str
    owner: str
    labels: dict[str, str]
    annotations: dict[str, str]
    envs: dict[str, str] = Field(default_factory=dict)
    access_token: str | None = None
    network: NetworkPolicy = OPEN
    replicas: int
    address: str  # this workload's pod address, reserved for its lifetime (paused included)
    id_base: int | None = None  # this workload's host uid/gid range (see .userns)
    pod: PodRecord | None = None  # the current pod (not terminating)
    terminating: list[PodRecord] = Field(default_factory=list)
    restarts: int = 0  # crashes since the last scale to 1 (drives the restart back-off)
    not_before: float = 0.0  # wall clock: no restart before this (crash back-off)
    deleting: bool = False
    pool: Pool | None = None  # a pool workload: its pod waits, warm, for a sandbox to claim it

    def pods(self) -> list[PodRecord]:
        """Every pod the record knows: the terminating ones and the current one."""
        return [*self.terminating, *([self.pod] if self.pod is not None else [])]


_WRONG_LAST_SEQUENCE = 10071  # JetStream's error code for a failed expected-revision check


def workload_key(name: str) -> str:
    return f"{WORKLOAD_PREFIX}{name}"


class WorkloadStore:
    """CAS access to the records; translates nats-py errors into ``shared.errors``.

    Writes made through this store (this process's reconciler) wake its waiters at once
    (:meth:`changed`); writes of other processes are seen by their next look."""

    def __init__(self, kv: KeyValue) -> None:
        self._kv = kv
        # Held only by waiters: a name nobody waits for has no entry.
        self._wakes: weakref.WeakValueDictionary[str, asyncio.Event] = weakref.WeakValueDictionary()

    def changed(self, name: str) -> asyncio.Event:
        """Set by the next write of ``name`` through this store: take it before reading the
        record, then wait on it (with a timeout, for other processes' writes) instead of
        sleeping."""
        wake = self._wakes.get(name)
        if wake is None:
            wake = self._wakes[name] = asyncio.Event()
        return wake

    def _written(self, name: str) -> None:
        wake = self._wakes.pop(name, None)
        if wake is not None:
            wake.set()

    async def get(self, name: str) -> tuple[WorkloadRecord, int] | None:
        try:
            entry = await self._kv.get(workload_key(name))
        except (KeyNotFoundError, BucketNotFoundError, InvalidKeyError):
            return None
        if entry.value is None or entry.revision is None:
            return None
        return WorkloadRecord.model_validate_json(entry.value), entry.revision

    async def create(self, record: WorkloadRecord) -> int | None:
        """The new revision, or ``None`` when the key already exists."""
        try:
            revision = await self._kv.create(
                workload_key(record.name), record.model_dump_json().encode()
            )
        except KeyWrongLastSequenceError:
            return None
        self._written(record.name)
        return revision

    async def put(self, record: WorkloadRecord, *, last: int) -> int:
        try:
            revision = await self._kv.update(
                workload_key(record.name), record.model_dump_json().encode(), last=last
            )
        except KeyWrongLastSequenceError as e:
            msg = f"workload {record.name} changed concurrently (expected revision {last})"
            raise Conflict(msg) from e
        self._written(record.name)
        return revision

    async def mutate(
        self, name: str, change: Callable[[WorkloadRecord], WorkloadRecord | None]
    ) -> tuple[WorkloadRecord, int]:
        """Read-modify-CAS until it sticks; ``change`` returning ``None`` means no write."""
        while True:
            current = await self.get(name)
            if current is None:
                msg = f"workload {name} not found"
                raise NotFound(msg)
            record, revision = current
            new = change(record)
            if new is None or new == record:
                return record, revision
            try:
                return new, await self.put(new, last=revision)
            except Conflict:
                continue

    async def remove(self, name: str, *, last: int) -> None:
        try:
            await self._kv.delete(workload_key(name), last=last)
        except (KeyWrongLastSequenceError, BadRequestError) as e:
            # nats-py's ``delete`` does not translate the stale revision as ``update`` does: it
            # surfaces JetStream's "wrong last sequence" (10071) as a plain BadRequestError.
            if isinstance(e, BadRequestError) and e.err_code != _WRONG_LAST_SEQUENCE:
                raise
            msg = f"workload {name} changed concurrently"
            raise Conflict(msg) from e
        self._written(name)

    async def _keys(self, prefix: str) -> list[str]:
        # Deleted keys are included; their ``get`` is None. (Not ``KeyValue.keys()``: it can miss
        # keys under load, and a start-up stray sweep that sees no workloads stops every pod.)
        keys = await key_names(self._kv)
        return sorted(k.removeprefix(prefix) for k in keys if k.startswith(prefix))

    async def names(self) -> list[str]:
        return await self._keys(WORKLOAD_PREFIX)


# A reservation this old whose workload has no record is left over (its creator died between
# reserving and writing the record, or the workload was deleted while no runtime ran). A younger
# one may be a create under way in another process: reserved, its record not written yet.
LEFT_OVER_AFTER = 60.0


class Reservation(_Frozen):
    """What a reservation key (an address, a host id range) holds."""

    workload: str
    at: float = 0.0  # wall clock of the reservation or its last move (0: a key from before)

    def is_left_over(self, names: set[str], now: float) -> bool:
        """Whether a sweep that found the workloads ``names`` may release it."""
        return self.workload not in names and now - self.at >= LEFT_OVER_AFTER


def reservation_value(workload: str) -> bytes:
    """The value of a reservation key for ``workload``, made or moved now."""
    return Reservation(workload=workload, at=time.time()).model_dump_json().encode()


async def reservation_of(kv: KeyValue, key: str) -> Reservation | None:
    """The reservation under ``key``, or ``None``: the one reader of both pools' keys."""
    try:
        entry = await kv.get(key)
    except KeyNotFoundError:
        return None
    if entry.value is None:
        return None
    try:
        return Reservation.model_validate_json(entry.value, strict=False)
    except ValueError:
        return None  # not a reservation: never taken for one


async def reservation_holder(kv: KeyValue, key: str) -> str | None:
    """The workload holding a reservation key, or ``None``."""
    reservation = await reservation_of(kv, key)
    return reservation.workload if reservation is not None else None
