"""``python -m services.cli run snapshotter``: captures processes on pause."""

from __future__ import annotations

from services.snapshotter.bootstrap import snapshotter_host
from services.snapshotter.settings import SnapshotterSettings
from shared.envd.ports import Envd
from shared.lifecycle.entry import run_worker
from shared.lifecycle.hosting import WorkerHost
from shared.runtime.ports import Runtime
from shared.settings import BusSettings, load


def main(argv: list[str] | None = None) -> int:
    del argv  # configured by environment variables only

    def make_host(bus: BusSettings, runtime: Runtime, envd: Envd) -> WorkerHost:
        return snapshotter_host(
            bus=bus, settings=load(SnapshotterSettings), runtime=runtime, envd=envd
        )

    return run_worker("snapshotter", make_host, supervise_runtime=False)


if __name__ == "__main__":
    raise SystemExit(main())
