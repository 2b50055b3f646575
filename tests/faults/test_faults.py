"""Fault injection while many sandboxes cycle through create / pause / resume / kill.

The whole system runs as real processes (``tests/support/stack.py``, with fast redelivery). Clients use the public
surfaces: the E2B REST API (create, pause, connect, kill), the proxy (auto-resume on the first
request), and the bus (commands published as another platform service would). Meanwhile:

- ``kill -9`` of a random service (api, proxy, scheduler, snapshotter, scaler), restarted soon;
- restart of NATS (same port and store);
- the daemon unreachable during a pause (``SIGSTOP`` of the pod's daemon for 1-12 s);
- duplicate commands (the same pause/resume published twice under different message ids);
- reordered commands (resume published while the pause is still in flight);
- some sandboxes auto-pause on a short timeout (the scheduler's expiry path).

Then the faults stop, every service is brought back, the system settles, and the invariants are
checked: no snapshot lost, every sandbox consistent with the runtime, no process replayed twice,
no orphaned pods or workloads, and the dead-letter stream (or a failed event) explains every
failure. Finally every failed sandbox must resume.

Bounded by default (CI); ``TORPOR_FAULT_CYCLES=1000 TORPOR_FAULT_SANDBOXES=8`` for a long run.
``TORPOR_FAULT_SEED`` picks the random sequence; ``TORPOR_FAULT_LOGS`` keeps the service logs.
"""

from __future__ import annotations

import asyncio
import base64
import collections
import contextlib
import json
import os
import random
import shutil
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import nats
import pytest

from shared.bus import subjects
from shared.bus.records import KvSandboxStore
from shared.bus.topology import KV_SANDBOXES, STREAM_DLQ, STREAM_EVT
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.envd.client import ConnectEnvdClient
from shared.lifecycle.replay import duplicates
from shared.models.messages import PauseSandbox, ResumeSandbox, msg_id
from shared.models.snapshots import ProcessConfig
from shared.ports.workloads import ANNOTATION_SNAPSHOT, Endpoint
from shared.runtime.local import LocalRuntime
from tests.conftest import skip_or_fail
from tests.support.pods import bwrap_pod_uids, daemon_pid, daemon_pids
from tests.support.stack import SERVICES, Stack

pytestmark = pytest.mark.slow

CYCLES = int(os.environ.get("TORPOR_FAULT_CYCLES", "24"))
SANDBOXES = int(os.environ.get("TORPOR_FAULT_SANDBOXES", "4"))
SEED = int(os.environ.get("TORPOR_FAULT_SEED", "11"))
COMMANDS = ["exec sleep 200001", "exec sleep 200002"]
STEADY = {SandboxState.RUNNING, SandboxState.PAUSED, SandboxState.FAILED, SandboxState.KILLED}
SETTLE = 240.0
FAULTS = ("kill9", "nats_restart")
USER = "faults"
DRIVER_FAULTS = ("daemon_stopped", "duplicate", "reordered", "auto_resume", "expiry", "kill")


@dataclass
class Tally:
    faults: collections.Counter[str] = field(default_factory=collections.Counter)
    ops: collections.Counter[str] = field(default_factory=collections.Counter)
    errors: collections.Counter[str] = field(default_factory=collections.Counter)
    cycles: int = 0  # completed pause → resume round trips
    created: list[str] = field(default_factory=list)
    killed: list[str] = field(default_factory=list)


@dataclass
class Rig:
    cluster: Stack
    store: KvSandboxStore
    js: Any
    envd: ConnectEnvdClient
    runtime: LocalRuntime
    tally: Tally = field(default_factory=Tally)
    rnd: random.Random = field(default_factory=lambda: random.Random(SEED))


@pytest.fixture
async def rig(tmp_path: Path) -> AsyncIterator[Rig]:
    if shutil.which("bwrap") is None:
        skip_or_fail("bubblewrap (bwrap) is not installed")
    root = Path(os.environ.get("TORPOR_FAULT_LOGS") or tmp_path)
    root.mkdir(parents=True, exist_ok=True)
    cluster = Stack(
        root,
        users={USER: False},
        fast_redelivery=True,
        log_level="info",
        env={
            "TORPOR_TUNING": "SCALER_GIVE_UP_AFTER=4,SNAPSHOTTER_GIVE_UP_AFTER=4,"
            "SNAPSHOTTER_ENVD_TIMEOUT=3"
        },
        data_dir=root / "rt",
    )
    try:
        async with cluster:
            nc = await nats.connect(
                cluster.nats_url, max_reconnect_attempts=-1, reconnect_time_wait=0.5
            )
            envd = ConnectEnvdClient()
            try:
                async with cluster.observer() as runtime:
                    try:
                        js = nc.jetstream()
                        store = KvSandboxStore(await js.key_value(KV_SANDBOXES))
                        yield Rig(cluster, store, js, envd, runtime)
                    finally:
                        cluster.stop_services()  # first: nobody restarts what the observer stops
            finally:
                await envd.close()
                await nc.close()
    finally:
        leftovers = [*bwrap_pod_uids(cluster.data_dir).values(), *daemon_pids(cluster.data_dir)]
        for pid in leftovers:  # belt and braces: no orphans, whatever happened above
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- client side (tolerant)


def _api(rig: Rig) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=rig.cluster.api_url, headers={"X-API-KEY": rig.cluster.keys[USER]}, timeout=70
    )


async def _call(rig: Rig, what: str, method: str, path: str, **kw: Any) -> int | None:
    """One REST call; transport errors (the api was killed) count as errors, never raise."""
    async with _api(rig) as http:
        try:
            r = await http.request(method, path, **kw)
        except httpx.HTTPError as e:
            rig.tally.errors[f"{what}:{type(e).__name__}"] += 1
            return None
    if r.status_code >= 400:
        rig.tally.errors[f"{what}:{r.status_code}"] += 1
    return r.status_code


async def _record(rig: Rig, sid: str) -> SandboxRecord | None:
    for _ in range(60):  # NATS may be restarting
        try:
            return await rig.store.get(sid)
        except Exception:
            await asyncio.sleep(0.5)
    return await rig.store.get(sid)


async def _steady(rig: Rig, sid: str, timeout: float = 90.0) -> SandboxRecord | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            rec = await rig.store.get(sid)
            if rec is None or rec.state in STEADY:
                return rec
        await asyncio.sleep(0.3)
    return await _record(rig, sid)


async def _publish(rig: Rig, cmd: PauseSandbox | ResumeSandbox, subject: str, mid: str) -> None:
    for _ in range(40):
        try:
            await rig.js.publish(
                subject, cmd.model_dump_json().encode(), headers={"Nats-Msg-Id": mid}
            )
            return
        except Exception:
            await asyncio.sleep(0.5)


async def _create(rig: Rig, n: int, *, short_timeout: bool) -> str | None:
    """Create (idempotent across api restarts) and start the two processes in it."""
    body = {
        "templateID": "sandbox-base",
        "timeout": 6 if short_timeout else 3600,
        "autoPause": True,
        "autoResume": True,
    }
    key = f"faults-{SEED}-{n}"
    sid = None
    give_up = time.monotonic() + 120  # the api may be restarting (slow on a loaded machine)
    while time.monotonic() < give_up:
        async with _api(rig) as http:
            try:
                r = await http.post("/sandboxes", json=body, headers={"Idempotency-Key": key})
                if r.status_code == 201:
                    sid = str(r.json()["sandboxID"])
                    break
                rig.tally.errors[f"create:{r.status_code}"] += 1
            except httpx.HTTPError as e:
                rig.tally.errors[f"create:{type(e).__name__}"] += 1
        await asyncio.sleep(1)
    if sid is None:
        return None
    rig.tally.created.append(sid)
    rec = await _steady(rig, sid)
    if rec is None or rec.state != SandboxState.RUNNING:
        return sid
    for command in COMMANDS:
        with contextlib.suppress(Exception):  # a fault may hit here too; checked at the end
            await rig.envd.start_process(
                Endpoint(host=rec.host or "", pod_uid=rec.pod_uid or ""),
                ProcessConfig(cmd="/bin/bash", args=["-l", "-c", command], cwd="/workspace"),
                tag=None,
                access_token=rec.envd_access_token,
            )
    return sid


# ---------------------------------------------------------------- the workload


async def _pause(rig: Rig, sid: str, rec: SandboxRecord, variant: str) -> None:
    if variant == "daemon_stopped" and rec.host and (pid := daemon_pid(rec.host)):
        os.kill(pid, signal.SIGSTOP)
        rig.tally.faults["daemon_stopped"] += 1
        try:
            call = asyncio.create_task(_call(rig, "pause", "POST", f"/sandboxes/{sid}/pause"))
            await asyncio.sleep(rig.rnd.uniform(1.0, 12.0))
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        await call
    elif variant in ("duplicate", "reordered"):
        cmd = PauseSandbox(sandbox_id=sid, generation=rec.generation, reason="timeout")
        subject = subjects.of(subjects.CMD_PAUSE, sid)
        await _publish(rig, cmd, subject, msg_id("pause", sid, rec.generation))
        if variant == "duplicate":
            await _publish(rig, cmd, subject, f"dup-pause-{sid}-{rec.generation}")
        else:  # the resume arrives before the pause has finished
            # Same generation as the pause: what a service that saw the sandbox running sends.
            resume = ResumeSandbox(sandbox_id=sid, generation=rec.generation, reason="auto")
            await _publish(
                rig, resume, subjects.of(subjects.CMD_RESUME, sid), f"early-{sid}-{rec.generation}"
            )
        rig.tally.faults[variant] += 1
    else:
        if variant == "daemon_stopped":  # no daemon process found for the record's address
            rig.tally.ops["daemon_not_found"] += 1
        await _call(rig, "pause", "POST", f"/sandboxes/{sid}/pause")
    rig.tally.ops["pause"] += 1


async def _resume(rig: Rig, sid: str, rec: SandboxRecord, variant: str, timeout: int) -> None:
    if variant == "auto_resume":
        headers = {
            "E2b-Sandbox-Id": sid,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": rec.envd_access_token or "",
        }
        async with httpx.AsyncClient(base_url=rig.cluster.proxy_url, timeout=70) as http:
            try:
                r = await http.get("/health", headers=headers)
                if r.status_code >= 400:
                    rig.tally.errors[f"auto_resume:{r.status_code}"] += 1
            except httpx.HTTPError as e:
                rig.tally.errors[f"auto_resume:{type(e).__name__}"] += 1
        rig.tally.faults["auto_resume"] += 1
    elif variant == "duplicate":
        cmd = ResumeSandbox(sandbox_id=sid, generation=rec.generation, reason="auto")
        subject = subjects.of(subjects.CMD_RESUME, sid)
        await _publish(rig, cmd, subject, msg_id("resume", sid, rec.generation))
        await _publish(rig, cmd, subject, f"dup-resume-{sid}-{rec.generation}")
    else:
        await _call(rig, "connect", "POST", f"/sandboxes/{sid}/connect", json={"timeout": timeout})
    rig.tally.ops["resume"] += 1


async def _worker(rig: Rig, index: int, budget: list[int], deadline: float) -> None:
    n = index * 1000
    sid = await _create(rig, n, short_timeout=index == 0)
    step = index
    while budget[0] > 0 and time.monotonic() < deadline:
        if sid is None:
            n += 1
            sid = await _create(rig, n, short_timeout=False)
            continue
        step += 1
        variant = DRIVER_FAULTS[step % len(DRIVER_FAULTS)] if rig.rnd.random() < 0.6 else "plain"
        rec = await _steady(rig, sid)
        if rec is None or rec.state == SandboxState.KILLED:
            sid = None
            continue
        if rec.state == SandboxState.RUNNING:
            if variant == "kill":
                for _ in range(30):  # retried while the api is down; 404: already gone
                    if await _call(rig, "kill", "DELETE", f"/sandboxes/{sid}") in (204, 404):
                        break
                    await asyncio.sleep(2)
                rig.tally.killed.append(sid)
                rig.tally.faults["kill"] += 1
                await _steady(rig, sid)
                n += 1
                sid = await _create(rig, n, short_timeout=False)
                continue
            if variant == "expiry" and index == 0:
                # This sandbox's timeout is short: let the scheduler pause it.
                await asyncio.sleep(8)
                rig.tally.faults["expiry"] += 1
                continue
            await _pause(rig, sid, rec, variant)
        elif rec.state in (SandboxState.PAUSED, SandboxState.FAILED):
            await _resume(rig, sid, rec, variant, 6 if index == 0 else 3600)
            after = await _steady(rig, sid)
            if rec.state == SandboxState.PAUSED and after and after.state == SandboxState.RUNNING:
                rig.tally.cycles += 1
                budget[0] -= 1
                if rig.tally.cycles % 50 == 0:  # progress of a long run (visible with -s)
                    print(
                        f"faults: {rig.tally.cycles} cycles, {dict(rig.tally.faults)}", flush=True
                    )


async def _inject(rig: Rig, stop: asyncio.Event) -> None:
    """Process-level faults: kill -9 of any service, NATS restarts."""
    kinds = ["kill9"] * 4 + ["nats_restart"]
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), rig.rnd.uniform(3.0, 8.0))
        if stop.is_set():
            return
        kind = rig.rnd.choice(kinds)
        if kind == "kill9":
            victim = rig.rnd.choice(SERVICES)
            rig.cluster.kill9(victim)
            rig.tally.faults[f"kill9:{victim}"] += 1
            await asyncio.sleep(rig.rnd.uniform(0.1, 1.5))
            rig.cluster.start_service(victim)
        else:
            await rig.cluster.restart_nats()
        rig.tally.faults[kind] += 1


# ---------------------------------------------------------------- invariants


async def _settle(rig: Rig) -> list[SandboxRecord]:
    for pid in daemon_pids(rig.cluster.data_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    for name in SERVICES:
        if not rig.cluster.alive(name):
            rig.cluster.start_service(name)
    await asyncio.gather(*(rig.cluster.wait_ready(name) for name in SERVICES))
    deadline = time.monotonic() + SETTLE
    while True:
        records = await rig.store.list()
        moving = [r for r in records if r.state not in STEADY]
        if not moving or time.monotonic() > deadline:
            return records
        await asyncio.sleep(1)


async def _stream_subjects(rig: Rig, stream: str, subject: str) -> list[tuple[str, bytes]]:
    """Every message of ``stream`` matching ``subject`` (an ephemeral ordered read)."""
    info = await rig.js.stream_info(stream)
    if info.state.messages == 0:
        return []
    sub = await rig.js.subscribe(subject, stream=stream, ordered_consumer=True)
    out = []
    try:
        while True:
            try:
                msg = await sub.next_msg(timeout=1.0)
            except TimeoutError:
                break
            out.append((msg.subject, msg.data))
    finally:
        await sub.unsubscribe()
    return out


async def _explained(rig: Rig) -> set[str]:
    """Sandbox ids with a dead letter, or a failed event that carries a reason."""
    ids = {
        s.rsplit(".", 1)[-1] for s, _ in await _stream_subjects(rig, STREAM_DLQ, "sandbox.dlq.>")
    }
    for subject, data in await _stream_subjects(rig, STREAM_EVT, f"{subjects.EVT_FAILED}.*"):
        if json.loads(data).get("reason"):
            ids.add(subject.rsplit(".", 1)[-1])
    return ids


def _commands(processes: list[Any]) -> list[str]:
    return sorted(p.config.args[-1] for p in processes if p.config.args)


async def _check_invariants(rig: Rig, records: list[SandboxRecord]) -> list[str]:
    problems: list[str] = []
    stuck = [f"{r.sandbox_id}:{r.state.value}" for r in records if r.state not in STEADY]
    if stuck:
        problems.append(f"not settled after {SETTLE:.0f}s: {stuck}")
    workloads = {w.name: w for w in await rig.runtime.list()}
    pods = bwrap_pod_uids(rig.cluster.data_dir)
    explained = await _explained(rig)
    live_names = set()
    for rec in records:
        sid, wl = rec.sandbox_id, workloads.get(rec.sandbox_id)
        if rec.state == SandboxState.KILLED:
            if wl is not None:
                problems.append(f"{sid}: killed but its workload exists")
            continue
        live_names.add(sid)
        if rec.state == SandboxState.FAILED:
            if not rec.failure or sid not in explained:
                problems.append(f"{sid}: failed ({rec.failure}) without a dead letter or event")
            continue
        if wl is None:
            problems.append(f"{sid}: {rec.state.value} but no workload")
            continue
        if rec.state == SandboxState.PAUSED:
            # No snapshot lost: the record and the annotation hold the same snapshot.
            if rec.snapshot is None:
                problems.append(f"{sid}: paused without a snapshot in the record")
            elif wl.annotations.get(ANNOTATION_SNAPSHOT) != rec.snapshot.annotation:
                problems.append(f"{sid}: annotation differs from the record's snapshot")
            else:
                doc = json.loads(base64.b64decode(rec.snapshot.annotation))
                got = sorted(p["config"]["args"][-1] for p in doc["processes"])
                if got != sorted(COMMANDS):
                    problems.append(f"{sid}: snapshot holds {got}, not the sandbox's processes")
            if wl.replicas != 0 or wl.pod_uid is not None:
                problems.append(f"{sid}: paused but replicas={wl.replicas} pod={wl.pod_uid}")
        elif rec.state == SandboxState.RUNNING:
            if wl.replicas != 1 or wl.pod_uid is None or wl.pod_uid != rec.pod_uid:
                problems.append(
                    f"{sid}: running but replicas={wl.replicas} pod={wl.pod_uid} "
                    f"record pod={rec.pod_uid}"
                )
                continue
            endpoint = Endpoint(host=rec.host or "", pod_uid=rec.pod_uid)
            if not await rig.envd.health(endpoint, timeout=5):
                problems.append(f"{sid}: running but its daemon does not answer")
                continue
            live = await rig.envd.list_processes(endpoint, access_token=rec.envd_access_token)
            if duplicates(live):
                problems.append(f"{sid}: processes replayed twice: {_commands(live)}")
            elif rec.snapshot is not None and _commands(live) != sorted(COMMANDS):
                problems.append(f"{sid}: after resume runs {_commands(live)}, not {COMMANDS}")
    orphans = set(workloads) - live_names
    if orphans:
        problems.append(f"orphaned workloads (no live record): {sorted(orphans)}")
    wanted = {w.pod_uid for w in workloads.values() if w.pod_uid is not None}
    stray = set(pods) - wanted
    if stray:
        problems.append(f"stray bwrap pods: {sorted(stray)}")
    return problems


async def _recover_failed(rig: Rig, records: list[SandboxRecord]) -> list[str]:
    problems = []
    for rec in records:
        if rec.state != SandboxState.FAILED:
            continue
        await _call(rig, "recover", "POST", f"/sandboxes/{rec.sandbox_id}/connect", json={})
        after = await _steady(rig, rec.sandbox_id)
        if after is None or after.state != SandboxState.RUNNING:
            problems.append(f"{rec.sandbox_id}: failed sandbox did not resume ({after})")
    return problems


# ---------------------------------------------------------------- the test


@pytest.mark.timeout(max(900, CYCLES * 12))
async def test_invariants_hold_under_faults(rig: Rig) -> None:
    stop = asyncio.Event()
    injector = asyncio.create_task(_inject(rig, stop))
    budget = [CYCLES]
    deadline = time.monotonic() + max(420.0, CYCLES * 10.0)
    started = time.monotonic()
    try:
        await asyncio.gather(*(_worker(rig, i, budget, deadline) for i in range(SANDBOXES)))
    finally:
        stop.set()
        await injector
    elapsed = time.monotonic() - started
    records = await _settle(rig)
    problems = await _check_invariants(rig, records)
    # The invariants are about convergence: a pod the runtime is still restarting after the last
    # fault gets a few more seconds, and a stray the periodic sweep stops (on its second sighting,
    # 10 s apart) up to 40, then the same checks must hold.
    for _ in range(20):
        if not problems:
            break
        await asyncio.sleep(2)
        records = await _settle(rig)
        problems = await _check_invariants(rig, records)
    summary = {
        "cycles": rig.tally.cycles,
        "seconds": round(elapsed),
        "faults": dict(rig.tally.faults),
        "ops": dict(rig.tally.ops),
        "client_errors": dict(rig.tally.errors),
        "sandboxes_created": len(rig.tally.created),
        "states": dict(collections.Counter(r.state.value for r in records)),
        "problems": problems,
    }
    print("fault run:", json.dumps(summary, indent=1))
    if out := os.environ.get("TORPOR_FAULT_REPORT"):
        Path(out).write_text(json.dumps(summary, indent=2) + "\n")
    assert not problems, problems
    assert not await _recover_failed(rig, records)
    # The faults really happened and the system still made progress through them.
    assert rig.tally.faults["kill9"] > 0
    assert rig.tally.faults["daemon_stopped"] + rig.tally.faults["duplicate"] > 0
    assert rig.tally.cycles >= min(CYCLES, 8), summary
