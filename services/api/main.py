"""``python -m services.api.main``: the API service (uvicorn), configured from the environment."""

from __future__ import annotations

import argparse
import contextlib
import sys

import structlog
import uvicorn

from services.api.app import create_app
from services.api.settings import ApiSettings
from shared.errors import ConfigError
from shared.logging import configure
from shared.quota.models import QuotaSettings
from shared.settings import BusSettings, LoggingSettings, load
from shared.web.limits import HttpLimits
from shared.web.serving import server_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="torpor-api", description=__doc__)
    parser.add_argument("--host", help="listen address (TORPOR_HOST)")
    parser.add_argument("--port", type=int, help="listen port (TORPOR_PORT)")
    args = parser.parse_args(argv)
    try:
        settings = load(ApiSettings)
        bus = load(BusSettings)
        logging_settings = load(LoggingSettings)
        limits = load(HttpLimits)
        quotas = load(QuotaSettings)
    except ConfigError as e:
        print(f"torpor-api: {e}", file=sys.stderr)
        return 2
    overrides = {k: v for k, v in (("host", args.host), ("port", args.port)) if v is not None}
    if overrides:
        settings = settings.model_copy(update=overrides)
    configure(logging_settings, service="api")
    app = create_app(settings, bus=bus, limits=limits, quotas=quotas)
    # structlog's handler on the root logger formats uvicorn too; RequestContext logs each
    # request (without headers), so uvicorn's access log is off.
    config = server_config(
        app,
        limits,
        host=settings.host,
        port=settings.port,
        timeout_graceful_shutdown=5,  # open dashboard event streams must not block a stop
    )
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run()
    structlog.get_logger().info("api_stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
