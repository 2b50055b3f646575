"""``python -m services.api.main``: the API service (uvicorn), configured from the environment."""

from __future__ import annotations

from typing import Any

from services.api.app import create_app
from services.api.settings import ApiSettings
from shared.quota.models import QuotaSettings
from shared.settings import BusSettings
from shared.web.limits import HttpLimits
from shared.web.serving import Sections, run_http_service


def build(settings: ApiSettings, sections: Sections) -> Any:
    return create_app(
        settings,
        bus=sections[BusSettings],
        limits=sections[HttpLimits],
        quotas=sections[QuotaSettings],
    )


def main(argv: list[str] | None = None) -> int:
    # structlog's handler on the root logger formats uvicorn too; RequestContext logs each
    # request (without headers), so uvicorn's access log is off.
    return run_http_service(
        argv,
        service="api",
        description=__doc__,
        settings=ApiSettings,
        sections=(BusSettings, QuotaSettings),
        build=build,
        variables=("TORPOR_HOST", "TORPOR_PORT"),
        timeout_graceful_shutdown=5,  # open dashboard event streams must not block a stop
    )


if __name__ == "__main__":
    raise SystemExit(main())
