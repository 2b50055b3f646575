"""The services ``torpor up`` supervises; add an entry here to supervise one more.

Every service is a package ``services.<name>`` with ``main.py`` defining
``main(argv: list[str] | None = None) -> int`` (``torpor run <name>`` calls it).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    # Which public port of ``torpor up`` the service listens on ("api" or "proxy"), if any. It is
    # handed over as ``TORPOR_HOST``/``TORPOR_PORT`` in that service's environment only.
    public_port: str | None = None
    # Readiness: ``/readyz`` on ``TORPOR_HEALTH_PORT``, or this path on the public port.
    public_probe: str = "/health"
    description: str = ""


SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec("api", public_port="api", description="E2B-compatible + native REST API"),
    ServiceSpec("proxy", public_port="proxy", description="sandbox traffic, auto-resume"),
    ServiceSpec("scheduler", description="deadlines and expiry"),
    ServiceSpec("snapshotter", description="captures processes on pause"),
    ServiceSpec("scaler", description="scales workloads 0/1, replays on resume"),
    ServiceSpec("deliverer", description="webhooks: signed deliveries, retries, history"),
    ServiceSpec("ledger", description="usage: running and paused time per sandbox and user"),
    ServiceSpec("builder", description="builds the templates users send"),
)

NAMES = tuple(s.name for s in SERVICES)


def by_name(name: str) -> ServiceSpec:
    for spec in SERVICES:
        if spec.name == name:
            return spec
    msg = f"unknown service {name!r}; choose one of: {', '.join(NAMES)}"
    raise KeyError(msg)
