"""structlog set-up: console locally, JSON in pods; context (correlation id, sandbox id) is bound
per message and per request through ``structlog.contextvars``."""

from __future__ import annotations

import logging
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

from shared.redaction import redact_value
from shared.settings import LoggingSettings


def redact_secrets(_: Any, __: str, event_dict: MutableMapping[str, Any]) -> dict[str, Any]:
    """Mask secrets by key and by shape in every field, the rendered traceback included (runs
    after ``format_exc_info``): a second line of defence, see ``shared/redaction.py``."""
    return {k: redact_value(k, v) for k, v in event_dict.items()}


def configure(settings: LoggingSettings, *, service: str) -> None:
    level = getattr(logging, settings.log_level.upper())
    shared_processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if settings.log_format == "json"
        # Plain tracebacks: the default (rich) one prints every frame's locals, request headers
        # with API keys and tokens included.
        else structlog.dev.ConsoleRenderer(
            colors=sys.stderr.isatty(), exception_formatter=structlog.dev.plain_traceback
        )
    )
    structlog.configure(
        processors=[
            *shared_processors,
            structlog.processors.format_exc_info,
            redact_secrets,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
    # Bridge stdlib loggers (nats, uvicorn, kubernetes, faststream) into the same output.
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
            foreign_pre_chain=[
                *shared_processors,
                structlog.stdlib.add_logger_name,
                structlog.processors.format_exc_info,
                redact_secrets,
            ],
        )
    )
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(max(level, logging.INFO))
    structlog.contextvars.clear_contextvars()
    structlog.contextvars.bind_contextvars(service=service)
