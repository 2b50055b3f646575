"""A private nats-server per test, the topology, and a "bus" acting as api + snapshotter + scaler:
it writes records straight into KV, publishes lifecycle events, and pulls the commands the
scheduler publishes from the real command durables (``snapshotter-pause``, ``scaler-lifecycle``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import nats
import pytest
from nats.aio.client import Client
from nats.js.client import JetStreamContext
from pydantic import BaseModel

from services.scheduler.bootstrap import scheduler_host
from services.scheduler.settings import SchedulerSettings
from shared.bus import subjects
from shared.bus.records import KvSandboxStore
from shared.bus.server import EmbeddedNats
from shared.bus.topology import (
    KV_SANDBOXES,
    SCALER_LIFECYCLE,
    SNAPSHOTTER_PAUSE,
    STREAM_CMD,
    ensure_topology,
)
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.lifecycle.hosting import Context, WorkerHost
from shared.models.messages import SandboxCreated, SandboxPaused, SandboxResumed, msg_id
from shared.settings import BusSettings, FeatureFlags, RetentionSettings
from tests.fakes.records import running_record


def now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Command:
    subject: str
    body: dict[str, Any]
    msg_id: str
    stored_at: datetime  # when JetStream stored it

    @property
    def verb(self) -> str:
        return self.subject.split(".")[2]

    @property
    def sandbox_id(self) -> str:
        return subjects.sandbox_id_of(self.subject)


@dataclass
class Bus:
    nc: Client
    js: JetStreamContext
    store: KvSandboxStore
    url: str
    _subs: list[Any] = field(default_factory=list)

    async def start(self) -> None:
        for durable in (SNAPSHOTTER_PAUSE, SCALER_LIFECYCLE):
            self._subs.append(await self.js.pull_subscribe_bind(durable.name, stream=STREAM_CMD))

    async def put(
        self,
        sandbox_id: str,
        *,
        owner: str = "alice",
        timeout: int = 2,
        auto_pause: bool = True,
        announce: bool = True,
    ) -> SandboxRecord:
        """A running sandbox whose full timeout starts now (what the scaler writes on create)."""
        at = now()
        record = running_record(
            sandbox_id, at=at, owner=owner, timeout=timeout, auto_pause=auto_pause
        )
        await self.store.create(record)
        if announce:
            await self.event(
                SandboxCreated(sandbox_id=sandbox_id, generation=1, at=at), subjects.EVT_CREATED
            )
        return record

    async def event(self, message: BaseModel, prefix: str, *, mid: str | None = None) -> None:
        sid = message.sandbox_id  # type: ignore[attr-defined]
        headers = {"Nats-Msg-Id": mid} if mid else None
        await self.js.publish(
            subjects.of(prefix, sid), message.model_dump_json().encode(), headers=headers
        )

    async def commands(self, *, within: float) -> list[Command]:
        """Every command published until ``within`` seconds pass with nothing new."""
        out: list[Command] = []
        deadline = asyncio.get_running_loop().time() + within
        while (left := deadline - asyncio.get_running_loop().time()) > 0:
            got = await self.next_command(timeout=min(left, 1.0))
            if got is not None:
                out.append(got)
        return out

    async def command(self, verb: str, *, timeout: float) -> Command:
        """The next command, which must come within ``timeout`` seconds and be a ``verb``."""
        cmd = await self.next_command(timeout=timeout)
        assert cmd is not None
        assert cmd.verb == verb
        return cmd

    async def next_command(self, *, timeout: float) -> Command | None:
        """The next command on either durable, or None after ``timeout`` seconds."""
        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        while (left := end - loop.time()) > 0:
            for sub in self._subs:
                try:
                    msgs = await sub.fetch(1, timeout=min(0.2, max(left, 0.05)))
                except (TimeoutError, nats.errors.TimeoutError):
                    continue
                for m in msgs:
                    await m.ack()
                    return Command(
                        subject=m.subject,
                        body=json.loads(m.data),
                        msg_id=(m.headers or {}).get("Nats-Msg-Id", ""),
                        stored_at=m.metadata.timestamp,
                    )
        return None

    # ---- acting as the snapshotter + scaler ----------------------------------------------------

    async def complete_pause(self, sandbox_id: str, *, retention: timedelta) -> SandboxRecord:
        def mutate(r: SandboxRecord) -> SandboxRecord:
            at = now()
            return r.model_copy(
                update={
                    "state": SandboxState.PAUSED,
                    "generation": r.generation + 1,
                    "deadline": None,
                    "paused_at": at,
                    "retain_until": at + retention,
                }
            )

        rec = await self.store.update(sandbox_id, mutate)
        await self.event(
            SandboxPaused(sandbox_id=sandbox_id, generation=rec.generation, at=now()),
            subjects.EVT_PAUSED,
            mid=msg_id("paused", sandbox_id, rec.generation),
        )
        return rec

    async def complete_resume(self, sandbox_id: str) -> SandboxRecord:
        def mutate(r: SandboxRecord) -> SandboxRecord:
            at = now()
            return r.model_copy(
                update={
                    "state": SandboxState.RUNNING,
                    "generation": r.generation + 1,
                    "started_at": at,
                    "deadline": at + timedelta(seconds=r.timeout),
                    "paused_at": None,
                    "retain_until": None,
                }
            )

        rec = await self.store.update(sandbox_id, mutate)
        await self.event(
            SandboxResumed(sandbox_id=sandbox_id, generation=rec.generation, at=now()),
            subjects.EVT_RESUMED,
            mid=msg_id("resumed", sandbox_id, rec.generation),
        )
        return rec


@pytest.fixture
async def bus(fresh_nats: EmbeddedNats) -> AsyncIterator[Bus]:
    nc = await nats.connect(fresh_nats.url)
    js = nc.jetstream()
    await ensure_topology(js)
    store = KvSandboxStore(await js.key_value(KV_SANDBOXES))
    b = Bus(nc=nc, js=js, store=store, url=fresh_nats.url)
    await b.start()
    yield b
    await nc.close()


def scheduler_context(
    url: str, *, pause_resume: str = "true", retention_seconds: int = 3600
) -> Context:
    return Context(
        bus=BusSettings(NATS_URL=url),
        flags=FeatureFlags(PAUSE_RESUME=pause_resume),
        retention=RetentionSettings(retention_seconds=retention_seconds),
    )


StartScheduler = Callable[..., Any]


@pytest.fixture
async def start_scheduler(bus: Bus) -> AsyncIterator[StartScheduler]:
    """``await start_scheduler(pause_resume="alice")``: an in-process scheduler on the test bus."""
    apps: list[WorkerHost] = []

    async def start(**kwargs: Any) -> WorkerHost:
        pause = {k: kwargs.pop(k) for k in ("pause_check_seconds", "pause_attempts") if k in kwargs}
        app = scheduler_host(scheduler_context(bus.url, **kwargs), SchedulerSettings(**pause))
        await app.start()
        apps.append(app)
        return app

    yield start
    for app in apps:
        await app.stop()


# ---- the scheduler as a real process (for kill -9 and replicas) ------------------------------


@dataclass
class SchedulerProcess:
    url: str
    env: dict[str, str]
    log_path: Any
    port: int = 0
    proc: Any = None

    def start(self) -> SchedulerProcess:
        import os
        import subprocess
        import sys

        from shared.bus.server import free_port

        self.port = free_port()
        env = {
            **os.environ,
            "NATS_URL": self.url,
            "TORPOR_HEALTH_HOST": "127.0.0.1",
            "TORPOR_HEALTH_PORT": str(self.port),
            "TORPOR_LOG_FORMAT": "json",
            **self.env,
        }
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "services.scheduler.main"], env=env, stdout=log, stderr=log
        )
        return self

    async def wait_ready(self, timeout: float = 60.0) -> None:
        import httpx

        loop = asyncio.get_running_loop()
        end = loop.time() + timeout
        async with httpx.AsyncClient() as client:
            while loop.time() < end:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"scheduler exited: {self.proc.returncode}")
                try:
                    r = await client.get(f"http://127.0.0.1:{self.port}/readyz", timeout=1)
                    if r.status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await asyncio.sleep(0.1)
        raise TimeoutError("scheduler not ready")

    async def metric(self, name: str) -> float:
        import httpx

        async with httpx.AsyncClient() as client:
            text = (await client.get(f"http://127.0.0.1:{self.port}/metrics", timeout=5)).text
        total = 0.0
        for line in text.splitlines():
            if line.startswith(name) and not line.startswith("#"):
                total += float(line.rsplit(" ", 1)[1])
        return total

    def kill9(self) -> None:
        import signal

        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except Exception:
                self.kill9()


@pytest.fixture
def scheduler_process(bus: Bus, tmp_path: Any) -> Any:
    started: list[SchedulerProcess] = []

    def make(**env: str) -> SchedulerProcess:
        p = SchedulerProcess(bus.url, env, tmp_path / f"scheduler-{len(started)}.log").start()
        started.append(p)
        return p

    yield make
    for p in started:
        p.stop()
