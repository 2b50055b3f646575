"""``python -m services.cli run snapshotter``: captures processes on pause."""

from __future__ import annotations

from services.snapshotter.bootstrap import snapshotter_host
from services.snapshotter.settings import SnapshotterSettings
from shared.lifecycle.entry import WorkerSpec, run_worker
from shared.settings import load

SPEC = WorkerSpec(
    "snapshotter",
    lambda: load(SnapshotterSettings),
    snapshotter_host,
    runtime="client",
    kept_files=True,
)


def main(argv: list[str] | None = None) -> int:
    return run_worker(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
