"""The ledger's own settings (``TORPOR_LEDGER_*``): the default size time is weighed by, for
each figure a sandbox's template does not set (or when the template cannot be read)."""

from __future__ import annotations

from shared.settings import SettingsBase, constant, prefixed


class LedgerSettings(SettingsBase):
    model_config = prefixed("ledger")

    cpu_count: float = constant(2, gt=0, le=1024)
    """Cores of a sandbox whose template sets no cpu limit (the API reports the same default)."""
    memory_mb: int = constant(512, ge=1)
    """Memory of a sandbox whose template sets no memory limit."""
    kept_mb: int = constant(1024, ge=0)
    """What a paused sandbox keeps, when its template sets no disk size (a template with
    `persist: none` keeps 0)."""
