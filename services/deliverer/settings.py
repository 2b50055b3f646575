"""The deliverer's own settings (``TORPOR_DELIVERER_*``). The address policy is shared with the
api (``shared.webhooks.settings.WebhookPolicySettings``, ``TORPOR_WEBHOOKS_*``)."""

from __future__ import annotations

from pydantic import Field

from shared.settings import SettingsBase, constant, prefixed


class DelivererSettings(SettingsBase):
    model_config = prefixed("deliverer")

    max_attempts: int = Field(default=10, ge=1, le=20)
    """Attempts per delivery before it is dead-lettered (with the last reason)."""
    backoff_base_seconds: float = constant(2.0, gt=0, le=3600)
    """Wait before the second attempt; doubles per attempt (±20 % jitter)."""
    backoff_cap_seconds: float = constant(600.0, gt=0, le=3600)
    """Longest wait between two attempts."""
    timeout_seconds: float = constant(10.0, gt=0, le=50)
    """One attempt: connect, send, and the receiver's status line (kept below the ack wait)."""
    max_workers: int = constant(16, ge=1, le=256)
    """Concurrent deliveries (and concurrent events fanned out) per replica."""
