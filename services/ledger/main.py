"""``python -m services.ledger.main``: the usage ledger worker (docs/usage.md).

Serves ``/livez``, ``/readyz`` and ``/metrics`` (the ``torpor_usage_*`` series) on
``TORPOR_HEALTH_PORT`` (default 8086, or ``--health-port``). Stops gracefully on SIGTERM.
"""

from __future__ import annotations

from services.ledger.bootstrap import ledger_host
from services.ledger.settings import LedgerSettings
from shared.lifecycle.entry import WorkerSpec, run_worker
from shared.settings import load

SPEC = WorkerSpec("ledger", lambda: load(LedgerSettings), ledger_host, health_port=8086)


def main(argv: list[str] | None = None) -> int:
    return run_worker(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
