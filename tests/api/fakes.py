"""In-memory stand-ins for unit tests of routing and error mapping (never the only test of a
flow: tests/e2e runs the real system). Transitions complete immediately."""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
from datetime import UTC, datetime, timedelta

from shared.auth.keys import hash_secret
from shared.auth.models import User
from shared.domain.record import SandboxRecord, SnapshotRef
from shared.domain.states import SandboxState
from shared.errors import Conflict, IllegalTransition, NotFound
from shared.models.network import NetworkPolicy
from shared.models.snapshot_records import SnapshotRecord, SnapshotState, new_snapshot_id
from shared.models.snapshots import Snapshot
from shared.ports.lifecycle import CreateRequest, ResumeResult

SNAPSHOT_JSON = {
    "captured_time": "2026-09-03T03:25:21.201354569Z",
    "processes": [
        {
            "config": {
                "cmd": "/bin/bash",
                "args": ["-l", "-c", "python3 server.py > service.log 2>&1"],
                "cwd": "/workspace",
            },
            "pid": 20,
        }
    ],
}


def now() -> datetime:
    return datetime.now(UTC)


class FakeKeys:
    def __init__(self) -> None:
        self.users: dict[str, User] = {}

    def add(self, secret: str, name: str, *, admin: bool = False) -> None:
        self.users[secret] = User(name=name, admin=admin, created_at=now())

    async def authenticate(self, secret: str) -> User | None:
        return self.users.get(secret)

    async def user_for_digest(self, digest: str) -> User | None:
        return next((u for s, u in self.users.items() if hash_secret(s) == digest), None)


class FakeLifecycle:
    def __init__(self, *, host: str = "127.0.0.1", resume_delay: float = 0.0) -> None:
        self.records: dict[str, SandboxRecord] = {}
        self.host = host
        self.resume_delay = resume_delay
        self.resume_calls = 0
        self.touches: list[str] = []
        self.created = 0

    def _put(self, record: SandboxRecord, **changes: object) -> SandboxRecord:
        new = record.model_copy(update={**changes, "updated_at": now()})
        self.records[new.sandbox_id] = new
        return new

    async def create(self, request: CreateRequest, *, wait: float = 60.0) -> SandboxRecord:
        sandbox_id = request.sandbox_id or "i" + secrets.token_hex(9)
        existing = self.records.get(sandbox_id)
        if existing is not None and existing.state != SandboxState.KILLED:
            raise Conflict(f"sandbox {sandbox_id} already exists")
        self.created += 1
        at = now()
        record = SandboxRecord(
            sandbox_id=sandbox_id,
            owner=request.owner,
            name=request.name,
            template=request.template,
            state=SandboxState.RUNNING,
            timeout=request.timeout,
            auto_pause=request.auto_pause,
            auto_pause_memory=request.auto_pause_memory,
            auto_resume=request.auto_resume,
            metadata=dict(request.metadata),
            envs=dict(request.envs),
            network=request.network,
            envd_access_token=secrets.token_urlsafe(16),
            host=self.host,
            created_at=at,
            started_at=at,
            deadline=at + timedelta(seconds=request.timeout),
            updated_at=at,
        )
        self.records[sandbox_id] = record
        return record

    async def get(self, sandbox_id: str, *, owner: str | None) -> SandboxRecord:
        record = self.records.get(sandbox_id)
        if record is None or record.state == SandboxState.KILLED:
            raise NotFound(f"sandbox {sandbox_id} not found")
        if owner is not None and record.owner != owner:
            raise NotFound(f"sandbox {sandbox_id} not found")
        return record

    async def list(self, *, owner: str | None) -> list[SandboxRecord]:
        return [
            r
            for r in self.records.values()
            if r.state != SandboxState.KILLED and (owner is None or r.owner == owner)
        ]

    async def pause(
        self, sandbox_id: str, *, owner: str | None, wait: float = 55.0, memory: bool = False
    ) -> SandboxRecord:
        record = await self.get(sandbox_id, owner=owner)
        if record.state == SandboxState.PAUSED:
            raise IllegalTransition(f"sandbox {sandbox_id} is already paused", state="paused")
        encoded = base64.b64encode(json.dumps(SNAPSHOT_JSON).encode()).decode()
        at = now()
        return self._put(
            record,
            state=SandboxState.PAUSED,
            generation=record.generation + 1,
            host=None,
            deadline=None,
            paused_at=at,
            retain_until=at + timedelta(days=7),
            snapshot=SnapshotRef(
                id="s1",
                captured_at=SNAPSHOT_JSON["captured_time"],
                process_count=1,
                annotation=encoded,
            ),
        )

    async def resume(
        self,
        sandbox_id: str,
        *,
        owner: str | None,
        timeout: int | None = None,
        auto_pause: bool | None = None,
        memory: bool | None = None,
        wait: float = 55.0,
    ) -> ResumeResult:
        record = await self.get(sandbox_id, owner=owner)
        if record.state == SandboxState.RUNNING:
            return ResumeResult(record=record, resumed=False)
        self.resume_calls += 1
        if self.resume_delay:
            await asyncio.sleep(self.resume_delay)
        at = now()
        record = self._put(
            record,
            state=SandboxState.RUNNING,
            generation=record.generation + 1,
            host=self.host,
            started_at=at,
            timeout=timeout or record.timeout,
            auto_pause=record.auto_pause if auto_pause is None else auto_pause,
            deadline=at + timedelta(seconds=timeout or record.timeout),
            paused_at=None,
            retain_until=None,
        )
        return ResumeResult(record=record, resumed=True)

    async def kill(self, sandbox_id: str, *, owner: str | None, wait: float = 30.0) -> None:
        record = await self.get(sandbox_id, owner=owner)
        self._put(record, state=SandboxState.KILLED, host=None)

    async def set_timeout(
        self, sandbox_id: str, *, owner: str | None, timeout: int
    ) -> SandboxRecord:
        record = await self.get(sandbox_id, owner=owner)
        return self._put(record, timeout=timeout, deadline=now() + timedelta(seconds=timeout))

    async def extend_timeout(
        self, sandbox_id: str, *, owner: str | None, timeout: int
    ) -> SandboxRecord:
        record = await self.get(sandbox_id, owner=owner)
        deadline = now() + timedelta(seconds=timeout)
        if record.deadline is not None and deadline <= record.deadline:
            return record
        return self._put(record, deadline=deadline)

    async def set_network(
        self, sandbox_id: str, *, owner: str | None, policy: NetworkPolicy
    ) -> SandboxRecord:
        record = await self.get(sandbox_id, owner=owner)
        return self._put(record, network=policy)

    async def touch(self, sandbox_id: str, *, seen_at: datetime | None = None) -> None:
        self.touches.append(sandbox_id)


class FakeRecords:
    """``RecordSource`` for the proxy, reading the fake lifecycle's dict."""

    def __init__(self, lifecycle: FakeLifecycle) -> None:
        self._lifecycle = lifecycle

    async def get(self, sandbox_id: str) -> SandboxRecord | None:
        return self._lifecycle.records.get(sandbox_id)

    def peek(self, sandbox_id: str) -> SandboxRecord | None:
        return self._lifecycle.records.get(sandbox_id)

    def remember(self, record: SandboxRecord) -> None:
        pass


class FakeSnapshots:
    """``services.api.deps.Snapshots`` in memory: a take is ready at once, with no processes."""

    def __init__(self, lifecycle: FakeLifecycle) -> None:
        self._lifecycle = lifecycle
        self.records: dict[str, SnapshotRecord] = {}

    async def take(
        self,
        sandbox_id: str,
        *,
        owner: str | None,
        name: str | None = None,
        internal: bool = False,
        files_only: bool = False,
        wait: float = 55.0,
    ) -> SnapshotRecord:
        source = await self._lifecycle.get(sandbox_id, owner=owner)
        at = now()
        snap = SnapshotRecord(
            snapshot_id=new_snapshot_id(),
            owner=source.owner,
            source_sandbox_id=sandbox_id,
            name=name,
            state=SnapshotState.READY,
            template=source.template,
            annotation=Snapshot.capture([], at=at).encode(),
            internal=internal,
            files_only=files_only,
            created_at=at,
            retain_until=at + timedelta(days=1),
            updated_at=at,
        )
        self.records[snap.snapshot_id] = snap
        return snap

    async def get(self, snapshot_id: str, *, owner: str | None) -> SnapshotRecord:
        snap = self.records.get(snapshot_id)
        if snap is None or (owner is not None and snap.owner != owner):
            raise NotFound(f"snapshot {snapshot_id} not found")
        return snap

    async def list(
        self, *, owner: str | None, sandbox_id: str | None = None, name: str | None = None
    ) -> list[SnapshotRecord]:
        return [
            s
            for s in self.records.values()
            if not s.internal
            and (owner is None or s.owner == owner)
            and (sandbox_id is None or s.source_sandbox_id == sandbox_id)
            and (name is None or s.name == name)
        ]

    async def delete(self, snapshot_id: str, *, owner: str | None) -> None:
        await self.get(snapshot_id, owner=owner)
        del self.records[snapshot_id]
