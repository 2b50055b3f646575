"""The operator's webhook address policy (``TORPOR_WEBHOOKS_*``), read by the api (at
registration) and the deliverer (at every delivery): both must refuse the same URLs."""

from __future__ import annotations

from pydantic import field_validator

from shared.settings import SettingsBase, constant, prefixed
from shared.webhooks.addresses import DEFAULT_CONTROL_PORTS, AddressPolicy, networks


def _items(value: str) -> list[str]:
    return [x.strip() for x in value.split(",") if x.strip()]


class WebhookPolicySettings(SettingsBase):
    model_config = prefixed("webhooks")

    allow_cidrs: str = ""
    """Comma-separated IP ranges that are not public but may receive webhooks (an internal
    receiver, `127.0.0.0/8` on a laptop). Default: none, only public addresses."""
    deny_cidrs: str = ""
    """Comma-separated IP ranges never to deliver to, whatever the port (e.g. the control plane's
    public addresses)."""
    control_ports: str = constant(",".join(str(p) for p in sorted(DEFAULT_CONTROL_PORTS)))
    """Comma-separated ports refused on every address that is not public, even in an allowed
    range: the control plane's (API, proxy, NATS, health/metrics, envd). `torpor up` adds the
    ports it gave its services."""
    extra_control_ports: str = ""
    """More such ports, added to `control_ports` (what `torpor up` sets)."""

    @field_validator("allow_cidrs", "deny_cidrs")
    @classmethod
    def _ranges(cls, value: str) -> str:
        networks(_items(value), name="TORPOR_WEBHOOKS_*_CIDRS")
        return value

    @field_validator("control_ports", "extra_control_ports")
    @classmethod
    def _ports(cls, value: str) -> str:
        for item in _items(value):
            if not item.isdigit() or not 0 < int(item) < 65536:
                msg = f"{item!r} is not a port"
                raise ValueError(msg)
        return value

    def policy(self, *, own_ports: tuple[int, ...] = ()) -> AddressPolicy:
        ports = {int(p) for p in _items(self.control_ports) + _items(self.extra_control_ports)}
        return AddressPolicy(
            allow=networks(_items(self.allow_cidrs), name="TORPOR_WEBHOOKS_ALLOW_CIDRS"),
            deny=networks(_items(self.deny_cidrs), name="TORPOR_WEBHOOKS_DENY_CIDRS"),
            control_ports=frozenset(ports | {p for p in own_ports if p}),
        )
