"""The size a sandbox is weighed by: its template's limits, each figure the template does not set
taken from the configured default (``TORPOR_LEDGER_*``), the whole default when the template
cannot be read (logged once per template name).

Sizes are cached per template name (templates rarely change; a failed read is retried on the
next sandbox of that template). The ledger fixes a sandbox's size at its first event, so a
template changed later never re-prices time already counted."""

from __future__ import annotations

from collections.abc import Callable

import structlog

from shared.errors import ConfigError, NotFound
from shared.models.usage import MIB, Size
from shared.runtime.template_sizes import TemplateSize

log = structlog.get_logger()

Reader = Callable[[str], TemplateSize]


class TemplateSizes:
    def __init__(self, read: Reader, default: Size) -> None:
        self._read = read
        self._default = default
        self._cache: dict[str, Size] = {}
        self._warned: set[str] = set()

    def of(self, template: str) -> Size:
        if (cached := self._cache.get(template)) is not None:
            return cached
        try:
            found = self._read(template)
        except (NotFound, ConfigError, ValueError, OSError) as e:
            if template not in self._warned:
                self._warned.add(template)
                log.warning("usage_template_size_unknown", template=template, error=str(e))
            return self._default
        size = Size(
            cpu=self._default.cpu if found.cpu is None else found.cpu,
            memory_mb=(
                self._default.memory_mb
                if found.memory_bytes is None
                else max(1, found.memory_bytes // MIB)
            ),
            kept_bytes=self._default.kept_bytes if found.kept_bytes is None else found.kept_bytes,
        )
        self._cache[template] = size
        return size
