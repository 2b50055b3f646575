"""The builder's own settings (``TORPOR_BUILDER_*``). Bus, runtime, logging and health are the
shared sections (``shared.settings``)."""

from __future__ import annotations

import re

from pydantic import Field, SecretStr, field_validator

from shared.models.network import MAX_RULES, normalize_cidr
from shared.settings import SettingsBase, constant, prefixed


class BuilderSettings(SettingsBase):
    model_config = prefixed("builder")

    max_workers: int = constant(2, ge=1, le=32)
    """Builds one builder process runs at once (the rest wait in the durable)."""
    step_timeout: float = constant(1800.0, gt=0)
    """Seconds one RUN step may take; then the build fails with that step."""
    pod_ready_timeout: float = constant(120.0, gt=0)
    """Seconds for a build pod to become ready."""
    allow_internet: bool = True
    """Whether build pods may reach the public internet (package downloads). `false`: only
    the allow-list (`TORPOR_BUILDER_EGRESS_ALLOW`) and what the build context brings (tests run
    offline builds this way). Either way never private, shared, link-local (cloud metadata),
    loopback, documentation, benchmarking or multicast ranges unless allow-listed, nor the host,
    the control plane or other pods (docs/templates.md)."""
    egress_allow: str = Field(default="", max_length=16384)
    """Addresses build pods may reach besides the public internet, `CIDR[,CIDR]` (IPv4; e.g.
    a private package mirror, `10.0.5.10/32`); with `allow_internet=false` the only ones."""
    memory: str = constant("2Gi")
    """Memory limit of a build pod."""
    cpu: str = constant("1")
    """CPU limit of a build pod."""
    disk: str = "4Gi"
    """Disk of a build pod (the files one RUN step may write)."""
    gc_interval: float = constant(300.0, gt=0)
    """Seconds between garbage collections of template layers, template files and uploads
    (local runtime; docs/templates.md)."""
    gc_grace: float = constant(600.0, ge=0)
    """Seconds a deleted build's files stay unused before they are removed (a create that read
    the build just before its delete is under way by then)."""
    gc_cache_max_age: float = constant(7 * 86400.0, ge=0)
    """Seconds a per-step cache layer no kept template lists may stay unused."""
    gc_cache_max_bytes: int = constant(20 * 2**30, ge=0)
    """Bytes of such cache layers kept at most (the least recently used go first)."""
    gc_upload_max_age: float = constant(86400.0, ge=0)
    """Seconds an uploaded build context no waiting or running build needs may stay unused."""
    registry: str | None = None
    """Kubernetes: where built templates go, `host[:port][/path prefix]` of an OCI registry the
    cluster's nodes pull from (no scheme). Unset: builds on Kubernetes fail with that reason."""
    registry_insecure: bool = False
    """Talk plain HTTP to the registry (a registry on the node's own loopback, tests)."""
    registry_username: str | None = None
    """Basic-auth user for pushing (from a Secret); never logged."""
    registry_password: SecretStr | None = None
    """Basic-auth password for pushing (from a Secret); never logged."""
    base_image: str = "torpor/sandbox-base:latest"
    """The sandbox base image in that registry (`repository:tag` or `repository@sha256:...`):
    what `from_debian_image`-style builds start from."""

    @field_validator("registry")
    @classmethod
    def _registry(cls, value: str | None) -> str | None:
        if value is not None and not _REGISTRY_RE.match(value):
            msg = "must be host[:port][/prefix] (lowercase, no scheme), e.g. reg.example:5000/t"
            raise ValueError(msg)
        return value

    @field_validator("base_image")
    @classmethod
    def _base_image(cls, value: str) -> str:
        if not _IMAGE_RE.match(value):
            msg = "must be repository:tag or repository@sha256:<64 hex> inside the registry"
            raise ValueError(msg)
        return value

    def registry_host(self) -> str:
        assert self.registry is not None
        return self.registry.split("/", 1)[0]

    def registry_prefix(self) -> str:
        assert self.registry is not None
        return self.registry.partition("/")[2]

    @field_validator("egress_allow")
    @classmethod
    def _check_egress(cls, value: str) -> str:
        parse_cidrs(value)
        return value

    @property
    def egress_allow_list(self) -> tuple[str, ...]:
        return parse_cidrs(self.egress_allow)


def parse_cidrs(value: str) -> tuple[str, ...]:
    """``CIDR,CIDR`` into normalized IPv4 networks; ``ValueError`` naming the bad entry."""
    cidrs = []
    for entry in filter(None, (e.strip() for e in value.split(","))):
        cidr = normalize_cidr(entry)
        if ":" in cidr:
            msg = f"{entry[:64]!r}: IPv6 is not offered (pods have no IPv6 address)"
            raise ValueError(msg)
        cidrs.append(cidr)
    if len(cidrs) > MAX_RULES:
        msg = f"at most {MAX_RULES} entries"
        raise ValueError(msg)
    return tuple(dict.fromkeys(cidrs))


_COMPONENT = r"[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*"
_REGISTRY_RE = re.compile(
    rf"^[a-z0-9]([a-z0-9.-]{{0,251}}[a-z0-9])?(:[0-9]{{1,5}})?(/{_COMPONENT})*$"
)
_IMAGE_RE = re.compile(
    rf"^{_COMPONENT}(/{_COMPONENT})*(:[A-Za-z0-9_][A-Za-z0-9._-]{{0,127}}|@sha256:[a-f0-9]{{64}})?$"
)
