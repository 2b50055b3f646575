"""``python -m services.cli run builder``: builds the templates users send (E2B's template API)."""

from __future__ import annotations

from services.builder.bootstrap import builder_host
from services.builder.settings import BuilderSettings
from shared.lifecycle.entry import WorkerSpec, run_worker
from shared.settings import load

SPEC = WorkerSpec(
    "builder", lambda: load(BuilderSettings), builder_host, runtime="client", health_port=8087
)


def main(argv: list[str] | None = None) -> int:
    return run_worker(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
