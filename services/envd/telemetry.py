"""What the daemon knows about its sandbox: resource samples and its own log, both in memory.

Metrics (E2B's envd samples its VM): every ``INTERVAL`` seconds, on 5-second buckets like E2B's
collector, the daemon samples

- CPU: the processes of the sandbox (the whole PID namespace when the daemon's parent is its
  init, as in a bubblewrap pod or when the daemon is PID 1 of a container; else the daemon's own
  process tree), as a share of the CPUs it may run on;
- memory: the resident set of those processes, against the cgroup's ``memory.max`` when one is
  set and visible, else the machine's ``MemTotal``;
- disk: the filesystem of its root (the workspace).

Samples live for ``KEEP`` (an hour); a pod that restarts (a resume) starts a new series. The log
is the daemon's own records at info and above (process starts and ends, errors), last
``MAX_LOG_ENTRIES`` of them. Both are served by ``GET /metrics`` and ``GET /logs``
(``services.envd.app``); the control plane reads them through its envd port.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

INTERVAL = 5.0
KEEP = 720  # samples: one hour at five seconds
MAX_LOG_ENTRIES = 1000
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")
_LEVELS = {"debug": 10, "info": 20, "warn": 30, "error": 40}


@dataclass(frozen=True)
class Sample:
    timestamp_unix: int
    cpu_count: int
    cpu_used_pct: float
    mem_used: int
    mem_total: int
    disk_used: int
    disk_total: int


def _proc_table() -> dict[int, tuple[int, int, int]]:
    """pid -> (ppid, utime+stime ticks, rss pages) of every process in this /proc."""
    out: dict[int, tuple[int, int, int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                raw = fh.read()
        except OSError:
            continue
        fields = raw[raw.rfind(b")") + 2 :].split()  # after "pid (comm) "
        with contextlib.suppress(IndexError, ValueError):
            out[int(name)] = (int(fields[1]), int(fields[11]) + int(fields[12]), int(fields[21]))
    return out


def _tree(table: dict[int, tuple[int, int, int]], top: int) -> list[int]:
    children: dict[int, list[int]] = collections.defaultdict(list)
    for pid, (ppid, _, _) in table.items():
        children[ppid].append(pid)
    out, todo = [], [top]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def _sandbox_top() -> int:
    """PID 1 when the daemon is, or is a child of, its namespace's init; else itself."""
    return 1 if os.getpid() == 1 or os.getppid() == 1 else os.getpid()


def _mem_total() -> int:
    with contextlib.suppress(OSError, ValueError):
        with open("/sys/fs/cgroup/memory.max") as fh:
            raw = fh.read().strip()
        if raw != "max":
            return int(raw)
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    return 0


class Metrics:
    """The sampler and its history; ``run()`` is the daemon's background task."""

    def __init__(self, root: str) -> None:
        self._root = root
        self._samples: collections.deque[Sample] = collections.deque(maxlen=KEEP)
        self._last: tuple[float, int] | None = None  # (monotonic, cpu ticks)

    def sample(self) -> Sample:
        table = _proc_table()
        pids = _tree(table, _sandbox_top())
        ticks = sum(table[p][1] for p in pids if p in table)
        rss = sum(table[p][2] for p in pids if p in table) * _PAGE
        cpus = len(os.sched_getaffinity(0)) or 1
        now = time.monotonic()
        pct = 0.0
        if self._last is not None and now > self._last[0]:
            used = (ticks - self._last[1]) / _TICKS
            pct = max(0.0, min(100.0, used / ((now - self._last[0]) * cpus) * 100))
        self._last = (now, ticks)
        disk = os.statvfs(self._root)
        sample = Sample(
            timestamp_unix=int(time.time()),
            cpu_count=cpus,
            cpu_used_pct=round(pct, 2),
            mem_used=rss,
            mem_total=_mem_total(),
            disk_used=(disk.f_blocks - disk.f_bfree) * disk.f_frsize,
            disk_total=disk.f_blocks * disk.f_frsize,
        )
        self._samples.append(sample)
        return sample

    def between(self, start: int | None, end: int | None) -> list[dict[str, Any]]:
        return [
            asdict(s)
            for s in self._samples
            if (start is None or s.timestamp_unix >= start)
            and (end is None or s.timestamp_unix <= end)
        ]

    async def run(self) -> None:
        log = logging.getLogger("envd.metrics")
        while True:
            try:
                await asyncio.to_thread(self.sample)
            except Exception:  # a sampling failure must not end the series
                log.exception("metrics sample failed")
            await asyncio.sleep(INTERVAL - time.time() % INTERVAL)  # on 5-second buckets


class LogBuffer(logging.Handler):
    """The daemon's last log records, as E2B's structured log entries."""

    def __init__(self) -> None:
        super().__init__(level=logging.INFO)
        self._entries: collections.deque[dict[str, Any]] = collections.deque(maxlen=MAX_LOG_ENTRIES)

    def emit(self, record: logging.LogRecord) -> None:
        level = "error" if record.levelno >= 40 else "warn" if record.levelno >= 30 else "info"
        with contextlib.suppress(Exception):
            self._entries.append(
                {
                    "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(),
                    "timestamp_ms": int(record.created * 1000),
                    "level": level,
                    "message": record.getMessage(),
                    "fields": {"logger": record.name},
                }
            )

    def query(
        self,
        *,
        cursor_ms: int | None,
        limit: int,
        backward: bool,
        level: str | None,
        search: str | None,
    ) -> list[dict[str, Any]]:
        floor = _LEVELS.get(level or "debug", 10)
        entries = [
            e
            for e in self._entries
            if _LEVELS[e["level"]] >= floor
            and (search is None or search in e["message"])
            and (
                cursor_ms is None
                or (e["timestamp_ms"] <= cursor_ms if backward else e["timestamp_ms"] >= cursor_ms)
            )
        ]
        if backward:
            entries.reverse()
        return entries[:limit]
