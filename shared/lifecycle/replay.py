"""Replaying a snapshot exactly once per pod (pure decisions; the scaler does the I/O).

A replay is keyed by ``<snapshot id>@<pod uid>`` and the key is stored on the workload
(``ANNOTATION_REPLAYED``) once done. The snapshotter writes the key of the pod it captured from at
capture time: that pod already runs those processes, so a resume that finds the same pod still
up (a pause that failed before scale-down) replays nothing.

Within a replay, processes already running in the pod are matched by (cmd, args, cwd, tag) as a
multiset and skipped: a fresh pod only runs what a replay started, so a redelivered resume that
crashed half-way starts only the processes still missing, in their original order.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from shared.models.snapshots import SnapshotProcess

Identity = tuple[str, tuple[str, ...], str | None, str | None]


def replay_key(snapshot_id: str, pod_uid: str) -> str:
    return f"{snapshot_id}@{pod_uid}"


def identity(process: SnapshotProcess) -> Identity:
    c = process.config
    return (c.cmd, tuple(c.args), c.cwd or None, process.tag or None)


@dataclass(frozen=True)
class Step:
    process: SnapshotProcess
    running_pid: int | None  # already running in the pod (started by an earlier attempt)


def plan(snapshot: list[SnapshotProcess], running: list[SnapshotProcess]) -> list[Step]:
    """One step per snapshot process, in the snapshot's (start) order."""
    available: dict[Identity, list[int]] = {}
    for p in running:
        available.setdefault(identity(p), []).append(p.pid)
    steps: list[Step] = []
    for p in snapshot:
        pids = available.get(identity(p))
        steps.append(Step(process=p, running_pid=pids.pop(0) if pids else None))
    return steps


def duplicates(running: list[SnapshotProcess]) -> dict[Identity, int]:
    """Identities running more than once (used by tests and the chaos checks)."""
    counts = Counter(identity(p) for p in running)
    return {k: v for k, v in counts.items() if v > 1}
