"""``python -m services.cli run scaler``: scales workloads 0/1, replays snapshots on resume."""

from __future__ import annotations

from services.scaler.bootstrap import scaler_host
from services.scaler.settings import ScalerSettings
from shared.envd.ports import Envd
from shared.lifecycle.entry import run_worker
from shared.lifecycle.hosting import WorkerHost
from shared.runtime.ports import Runtime
from shared.settings import BusSettings, load


def main(argv: list[str] | None = None) -> int:
    del argv  # configured by environment variables only

    def make_host(bus: BusSettings, runtime: Runtime, envd: Envd) -> WorkerHost:
        return scaler_host(bus=bus, settings=load(ScalerSettings), runtime=runtime, envd=envd)

    return run_worker("scaler", make_host, supervise_runtime=True)


if __name__ == "__main__":
    raise SystemExit(main())
