"""``python -m services.cli run scaler``: scales workloads 0/1, replays snapshots on resume."""

from __future__ import annotations

from services.scaler.bootstrap import scaler_host
from services.scaler.settings import ScalerSettings
from shared.lifecycle.entry import WorkerSpec, run_worker
from shared.settings import load

# The scaler supervises the local runtime's pods (one reconciler per machine).
SPEC = WorkerSpec(
    "scaler", lambda: load(ScalerSettings), scaler_host, runtime="supervise", kept_files=True
)


def main(argv: list[str] | None = None) -> int:
    return run_worker(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
