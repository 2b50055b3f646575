"""``python -m services.scheduler.main``: the scheduler worker (timeouts, auto-pause, retention).

Serves ``/livez``, ``/readyz`` (NATS connected) and ``/metrics`` on ``TORPOR_HEALTH_PORT``
(default 8083, or ``--health-port``). Stops gracefully on SIGTERM/SIGINT (in-flight messages
finish; the rest stay in the durables).
"""

from __future__ import annotations

from services.scheduler.bootstrap import scheduler_host
from services.scheduler.settings import SchedulerSettings
from shared.lifecycle.entry import WorkerSpec, run_worker
from shared.settings import load

SPEC = WorkerSpec("scheduler", lambda: load(SchedulerSettings), scheduler_host, health_port=8083)


def main(argv: list[str] | None = None) -> int:
    return run_worker(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
