"""Settings read once from the environment into pydantic-settings objects and passed in.

Each service composes the pieces it needs (``services/<name>/settings.py``). No module-level
singletons: call ``load(SomeSettings)`` in the entrypoint and hand the object down.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import (
    AliasChoices,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, SettingsConfigDict

from shared.errors import ConfigError


class _Base(BaseSettings):
    model_config = SettingsConfigDict(frozen=True, extra="ignore", env_prefix="TORPOR_")


class BusSettings(_Base):
    """How to reach NATS, and as whom: ``NATS_USER``/``NATS_PASSWORD``, or a credentials file
    ``NATS_CREDS`` (JWT + nkey), or credentials in ``NATS_URL`` (``nats://user:pass@host:4222``).
    Without any, the client is anonymous (and warns if the bus lets it in)."""

    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        validation_alias=AliasChoices("NATS_URL", "TORPOR_NATS_URL"),
    )
    nats_creds: Path | None = Field(
        default=None, validation_alias=AliasChoices("NATS_CREDS", "TORPOR_NATS_CREDS")
    )
    nats_user: str | None = Field(
        default=None,
        validation_alias=AliasChoices("NATS_USER", "TORPOR_NATS_USER"),
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
    )
    nats_password: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("NATS_PASSWORD", "TORPOR_NATS_PASSWORD")
    )
    # Stream and KV replicas: 1 for the embedded broker, 3 for a production cluster.
    bus_replicas: int = Field(default=1, ge=1, le=5)
    # false: streams/KV/durables are created by someone else (deploy/: a provisioning Job with
    # the admin user), because least-privilege service users may not create them.
    bus_provision: bool = True

    @field_validator("nats_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        for url in value.split(","):
            scheme, sep, rest = url.strip().partition("://")
            if not sep or scheme not in {"nats", "tls", "ws", "wss"} or not rest:
                msg = f"NATS_URL must look like nats://host:4222, got {url!r}"
                raise ValueError(msg)
        return value

    @model_validator(mode="after")
    def _check_credentials(self) -> BusSettings:
        if (self.nats_user is None) != (self.nats_password is None):
            msg = "NATS_USER and NATS_PASSWORD go together"
            raise ValueError(msg)
        if self.nats_user is not None and self.nats_creds is not None:
            msg = "set either NATS_CREDS or NATS_USER/NATS_PASSWORD, not both"
            raise ValueError(msg)
        return self

    @property
    def authenticated(self) -> bool:
        """Whether the client presents credentials (settings or user info in the URL)."""
        in_url = any("@" in u.partition("://")[2].split("/")[0] for u in self.nats_url.split(","))
        return self.nats_user is not None or self.nats_creds is not None or in_url


class LoggingSettings(_Base):
    log_format: Literal["console", "json"] = "console"
    log_level: Literal["debug", "info", "warning", "error"] = "info"


class RuntimeSettings(_Base):
    """Which runtime moves the workloads, and where."""

    runtime: Literal["local", "kubernetes"] = "local"
    namespace: str = "torpor-sandboxes"  # kubernetes: where sandbox ReplicaSets live
    # kubernetes: the namespace of the proxy/scaler/snapshotter when it is not ``namespace``
    # (sandbox pods accept connections only from their pods; see the per-sandbox NetworkPolicy).
    control_plane_namespace: str | None = None
    kubeconfig: Path | None = None  # kubernetes: None = in-cluster config
    templates_dir: Path | None = None  # None = the packaged templates
    data_dir: Path = Path.home() / ".local" / "share" / "torpor"  # local runtime: pod dirs, volumes


class FeatureFlags(_Base):
    """``PAUSE_RESUME``: ``true`` for everyone, ``false``/unset for no one, or a comma-separated
    list of user names. Gates only auto-pause on timeout, never manual pause/resume."""

    pause_resume: str = Field(
        default="false", validation_alias=AliasChoices("PAUSE_RESUME", "TORPOR_PAUSE_RESUME")
    )

    def pause_resume_enabled_for(self, user: str) -> bool:
        raw = self.pause_resume.strip()
        if raw.lower() in {"true", "1", "yes", "on", "*"}:
            return True
        if raw.lower() in {"", "false", "0", "no", "off"}:
            return False
        return user in {u.strip() for u in raw.split(",") if u.strip()}


S = TypeVar("S", bound=BaseSettings)


def load(cls: type[S], **overrides: Any) -> S:
    """Read settings from the environment (``overrides`` win, e.g. a command-line flag); bad
    values become one readable ``ConfigError`` line."""
    try:
        return cls(**overrides)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or cls.__name__
        msg = f"invalid configuration {where}: {first['msg']}"
        raise ConfigError(msg) from None
