"""Settings read once from the environment into pydantic-settings objects and passed in.

``SettingsBase`` is the base of every settings class. The sections every service shares are
defined once, here: bus, logging, runtime, health, retention, feature flags. Each service's own
knobs are in ``services/<name>/settings.py`` and carry the service in their name
(``TORPOR_SCALER_READY_TIMEOUT``). docs/configuration.md is generated from these classes
(``python -m services.cli.settings_doc``); a field's docstring is its documentation.
No module-level singletons: call ``load(SomeSettings)`` in the entrypoint and hand it down.
"""

from __future__ import annotations

import functools
import os
import re
from datetime import timedelta
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
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from shared.errors import ConfigError

_CONSTANT = "torpor_constant"


def constant(default: Any, **limits: Any) -> Any:
    """A tuning constant of a settings class: typed and validated like a setting and set in code
    (the composition root takes the default, tests pass small values), but never read from the
    environment and not in docs/configuration.md: what an operator tunes is a setting, the rest
    is a constant."""
    return Field(default=default, json_schema_extra={_CONSTANT: True}, **limits)


def is_constant(field: FieldInfo) -> bool:
    extra = field.json_schema_extra
    return isinstance(extra, dict) and extra.get(_CONSTANT) is True


# The constants tests and benchmarks set across a process boundary (a service they start), through
# the one variable ``TORPOR_TUNING``: each named as it would be as a variable, minus ``TORPOR_``
# (``<section>_<field>``). Their defaults are what production runs; no operator tunes them.
TUNABLE: frozenset[str] = frozenset(
    {
        "SCALER_GIVE_UP_AFTER",
        "SCALER_HEARTBEAT_SECONDS",
        "SNAPSHOTTER_GIVE_UP_AFTER",
        "SNAPSHOTTER_ENVD_TIMEOUT",
        "SNAPSHOTTER_HEARTBEAT_SECONDS",
        "SCHEDULER_PAUSE_CHECK_SECONDS",
        "SCHEDULER_FETCH_BATCH",
        "DELIVERER_BACKOFF_BASE_SECONDS",
        "DELIVERER_BACKOFF_CAP_SECONDS",
        "BUILDER_GC_INTERVAL",
        "BUILDER_GC_GRACE",
        "BUILDER_POD_READY_TIMEOUT",
        "STOP_GRACE",
    }
)
TUNING_VARIABLE = "TORPOR_TUNING"


def parse_tuning(value: str) -> dict[str, str]:
    """``NAME=VALUE[,NAME=VALUE]`` into values by name; ``ValueError`` naming the bad entry. The
    values are validated by the field they set."""
    return dict(_parsed_tuning(value))


@functools.lru_cache(maxsize=4)
def _parsed_tuning(value: str) -> tuple[tuple[str, str], ...]:
    # Once per process and value: every settings class a service loads reads the same variable.
    if len(value) > 4096:
        raise ValueError("longer than 4096 characters")
    values: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in value.split(","))):
        name, sep, raw = entry.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or name not in TUNABLE:
            raise ValueError(f"entry {entry[:80]!r}: expected NAME=VALUE, NAME one of the tunables")
        if name in values:
            raise ValueError(f"{name} given twice")
        values[name] = raw
    return tuple(values.items())


def tuning_key(settings_cls: type[BaseSettings], field_name: str) -> str:
    """The name of a constant in ``TORPOR_TUNING``: its variable's name without ``TORPOR_``."""
    prefix = str(settings_cls.model_config.get("env_prefix", "")).removeprefix("TORPOR_")
    return f"{prefix}{field_name}".upper()


class _WithoutConstants(PydanticBaseSettingsSource):
    """The environment, minus the fields declared with ``constant``; of those, only the
    ``TUNABLE`` ones, and only through ``TORPOR_TUNING``."""

    def __init__(self, settings_cls: type[BaseSettings], source: PydanticBaseSettingsSource):
        super().__init__(settings_cls)
        self._source = source
        self._constants = {n for n, f in settings_cls.model_fields.items() if is_constant(f)}

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values = {k: v for k, v in self._source().items() if k not in self._constants}
        try:
            tuning = parse_tuning(os.environ.get(TUNING_VARIABLE, ""))
        except ValueError as e:
            raise ConfigError(f"invalid configuration {TUNING_VARIABLE}: {e}") from None
        for name in self._constants:
            key = tuning_key(self.settings_cls, name)
            if key in tuning:
                values[name] = tuning[key]
        return values


class SettingsBase(BaseSettings):
    model_config = SettingsConfigDict(
        frozen=True,
        extra="ignore",
        env_prefix="TORPOR_",
        populate_by_name=True,
        use_attribute_docstrings=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings, _WithoutConstants(settings_cls, env_settings))


def prefixed(section: str) -> SettingsConfigDict:
    """The config of a service's own settings, or of a section of them: ``TORPOR_<SECTION>_``
    names (``TORPOR_SCALER_READY_TIMEOUT``, ``TORPOR_HTTP_MAX_CONNECTIONS``)."""
    prefix = f"TORPOR_{section.upper()}_"
    return SettingsConfigDict(**{**SettingsBase.model_config, "env_prefix": prefix})


FORMER_NAMES: set[str] = set()


def formerly(field: str, *, service: str, old: str) -> AliasChoices:
    """``TORPOR_<SERVICE>_<FIELD>``, else the name the knob had before it was split by service
    (still read, so existing deployments keep working; documented as deprecated)."""
    FORMER_NAMES.add(old)
    return AliasChoices(f"TORPOR_{service.upper()}_{field.upper()}", old)


class BusSettings(SettingsBase):
    """How to reach NATS, and as whom: ``NATS_USER``/``NATS_PASSWORD``, or a credentials file
    ``NATS_CREDS`` (JWT + nkey), or credentials in ``NATS_URL`` (``nats://user:pass@host:4222``).
    Without any, the client is anonymous (and warns if the bus lets it in)."""

    nats_url: str = Field(
        default="nats://127.0.0.1:4222",
        validation_alias=AliasChoices("NATS_URL", "TORPOR_NATS_URL"),
    )
    """NATS server(s), comma-separated; schemes `nats`, `tls`, `ws`, `wss`; may carry
    credentials (`nats://user:pass@host:4222`)."""
    nats_creds: Path | None = Field(
        default=None, validation_alias=AliasChoices("NATS_CREDS", "TORPOR_NATS_CREDS")
    )
    """NATS credentials file (JWT/NKEY auth). Not together with `NATS_USER`."""
    nats_user: str | None = Field(
        default=None,
        validation_alias=AliasChoices("NATS_USER", "TORPOR_NATS_USER"),
        pattern=r"^[A-Za-z0-9_.-]{1,64}$",
    )
    """The service's NATS user and password (set both, or neither). Under `torpor up` each
    service gets its own; on Kubernetes the Deployment sets both (the password from the
    Secret `torpor-nats-auth`). Never logged."""
    nats_password: SecretStr | None = Field(
        default=None, validation_alias=AliasChoices("NATS_PASSWORD", "TORPOR_NATS_PASSWORD")
    )
    """The service's NATS user and password (set both, or neither). Under `torpor up` each
    service gets its own; on Kubernetes the Deployment sets both (the password from the
    Secret `torpor-nats-auth`). Never logged."""
    bus_replicas: int = Field(default=1, ge=1, le=5)
    """Replicas of streams and KV buckets, 1-5 (3 on a production NATS cluster)."""
    kept_files_max_bytes: int = Field(default=256 * 1024**2, ge=1024**2, le=2**50)
    """Size bound of the kept-files object store (`torpor_kept_files`: Kubernetes `persist:
    store` sandboxes' files while paused, and stored snapshots' files there), in bytes, 1 MiB
    to 1 PiB; reserved from NATS's `max_file_store`, so raise both together. When full, a pause
    that needs it fails and the sandbox keeps running. Set where the bus is provisioned."""
    bus_provision: bool = True
    """`false`: do not create or change streams, KV buckets and durables at start-up (on
    Kubernetes the provisioning Job does that, because service NATS users may not)."""

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


class LoggingSettings(SettingsBase):
    log_format: Literal["console", "json"] = "console"
    """`console` or `json`."""
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    """`debug`, `info`, `warning`, `error`."""


class RuntimeSettings(SettingsBase):
    """Which runtime moves the workloads, and where."""

    runtime: Literal["local", "kubernetes"] = "local"
    """`local` (bubblewrap-isolated process trees) or `kubernetes` (one ReplicaSet per sandbox)."""
    namespace: str = "torpor-sandboxes"  # kubernetes: where sandbox ReplicaSets live
    """kubernetes: namespace of the sandbox ReplicaSets (`deploy/` sets the pod's own namespace,
    `torpor`)."""
    control_plane_namespace: str | None = None
    """kubernetes: namespace of the control plane (proxy, scaler, snapshotter, scheduler,
    builder), when sandboxes live elsewhere. Each sandbox's NetworkPolicy admits connections
    only from pods labelled `torpor.dev/sandbox-access: "true"` in it."""
    kubeconfig: Path | None = None  # kubernetes: None = in-cluster config
    """kubernetes: kubeconfig file; unset means the in-cluster ServiceAccount. `KUBECONFIG` is
    not read."""
    storage_class: str | None = Field(
        default=None, pattern=r"^[a-z0-9]([a-z0-9.-]{0,251}[a-z0-9])?$"
    )
    """kubernetes: StorageClass of each sandbox's data claim (`torpor-data-<sandbox id>`,
    ReadWriteOnce, sized by the template's `sandbox-data` `emptyDir.sizeLimit`), which keeps
    `/home/user` and `/workspace` across a pause; deleted with the sandbox. Unset: the cluster's
    default class."""
    templates_dir: Path | None = None  # None = the packaged templates
    """Sandbox templates (`<name>.yaml`), searched before the packaged
    `shared/runtime/templates/` (local) or `deploy/sandbox-base/` (kubernetes)."""
    data_dir: Path = Path.home() / ".local" / "share" / "torpor"  # local runtime: pod dirs, volumes
    """State of `torpor up` and of the local runtime: NATS store, logs, `torpor.json`,
    `admin-api-key`, pod dirs, volumes."""
    pools: str = Field(default="", max_length=4096)
    """Warm pods per template, `TEMPLATE=N[,TEMPLATE=N]` (e.g. `sandbox-base=2`; empty: no
    pools). A create or resume of such a template claims a ready pod instead of starting one
    (the `created`/`resumed` events say `path: warm`), and falls back to a cold start when none
    is ready; the runtime that supervises pods (the scaler's) refills the pool in the
    background, one pod at a time and never while it starts a sandbox's pod. Pool pods belong
    to no user and count against no quota. Local runtime: every template; Kubernetes: templates
    with `persist: none` only, with the `warm-pools` deploy component (see
    [architecture.md](architecture.md#warm-pools))."""

    pool_claim_timeout: float = Field(
        default=60.0,
        ge=1.0,
        le=3600.0,
        allow_inf_nan=False,
        validation_alias="TORPOR_POOL_CLAIM_TIMEOUT",
    )
    """kubernetes: seconds after which a pool pod claimed by a runtime that never finished the
    claim (its process died between marking the pod and adopting it) is deleted by the scaler
    that keeps the pools, so a dead claimer leaves no orphan pod. Above the longest claim (a
    few seconds); below it, a slow claim loses its pod and starts cold."""
    pool_start_timeout: float = constant(300.0, ge=5.0, le=3600.0, allow_inf_nan=False)
    """kubernetes: seconds a pool pod may take to become ready (image pull included) before the
    scaler that keeps the pools deletes it and starts another; a failed pool pod goes at once.
    The pool fills one pod at a time, so one pod that never starts would stop its refill."""

    @field_validator("pools")
    @classmethod
    def _check_pools(cls, value: str) -> str:
        parse_pools(value)
        return value

    @property
    def pool_sizes(self) -> dict[str, int]:
        return parse_pools(self.pools)


_POOL_TEMPLATE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,61}[a-z0-9])?$")
MAX_POOL_SIZE = 64


def parse_pools(value: str) -> dict[str, int]:
    """``TEMPLATE=N,...`` into sizes; ``ValueError`` naming the bad entry."""
    sizes: dict[str, int] = {}
    for entry in filter(None, (e.strip() for e in value.split(","))):
        template, sep, count = entry.partition("=")
        template, count = template.strip(), count.strip()
        if not sep or not _POOL_TEMPLATE.fullmatch(template):
            raise ValueError(f"pool entry {entry[:80]!r}: expected TEMPLATE=N")
        if not count.isdigit() or not 0 <= int(count) <= MAX_POOL_SIZE:
            raise ValueError(f"pool size of {template}: a number from 0 to {MAX_POOL_SIZE}")
        if template in sizes:
            raise ValueError(f"pool of {template} given twice")
        sizes[template] = int(count)
    return sizes


class HealthSettings(SettingsBase):
    """Where a worker serves ``/livez``, ``/readyz`` and ``/metrics``."""

    health_host: str = "0.0.0.0"
    """Listen address of the probes and metrics."""
    health_port: int = Field(default=8080, ge=0, le=65535)
    """Their port (0: any free port). The scheduler's default is 8083; ``--health-port`` wins."""
    health_fd: int | None = Field(default=None, ge=3)
    """A listening socket handed down by a supervisor (``torpor up``), as an open file
    descriptor: served instead of binding ``health_port``, so a restart never loses the port."""


DAY = 86400


class RetentionSettings(SettingsBase):
    """How long records are kept; read by the scaler (which writes ``retain_until``) and the
    scheduler (which deletes at it), so one value serves both."""

    retention_seconds: int = Field(default=30 * DAY, ge=1)
    """Paused sandboxes (and sandboxes whose create failed) are deleted this long after."""
    tombstone_seconds: int = constant(DAY, ge=0)
    """Killed sandboxes stay in KV as tombstones this long."""

    @property
    def retention(self) -> timedelta:
        return timedelta(seconds=self.retention_seconds)

    @property
    def tombstone_for(self) -> timedelta:
        return timedelta(seconds=self.tombstone_seconds)


class FeatureFlags(SettingsBase):
    """``PAUSE_RESUME``: ``true`` for everyone, ``false``/unset for no one, or a comma-separated
    list of user names. Gates only auto-pause on timeout, never manual pause/resume."""

    pause_resume: str = Field(
        default="false", validation_alias=AliasChoices("PAUSE_RESUME", "TORPOR_PAUSE_RESUME")
    )
    """Auto-pause on timeout. `true`/`1`/`yes`/`on`/`*` = everyone; `false`/`0`/`no`/`off`/empty
    = no one; otherwise a comma-separated list of user names. The scheduler uses it to decide
    pause or delete on expiry. The api only shows it on the dashboard. Manual pause/resume
    and auto-resume never depend on it."""

    def pause_resume_enabled_for(self, user: str) -> bool:
        raw = self.pause_resume.strip()
        if raw.lower() in {"true", "1", "yes", "on", "*"}:
            return True
        if raw.lower() in {"", "false", "0", "no", "off"}:
            return False
        return user in {u.strip() for u in raw.split(",") if u.strip()}


class TuningSettings(SettingsBase):
    """Constants tests set in the services they start; not for production."""

    tuning: str = Field(default="", max_length=4096)
    """Tests and benchmarks only: `NAME=VALUE[,NAME=VALUE]` sets tuning constants of the
    services a test starts (shorter heartbeats, fewer deliveries, a faster garbage collection),
    each validated like a setting; their defaults are in the services' settings classes. An
    unknown name, or one given twice, stops every service with one line."""

    @field_validator("tuning")
    @classmethod
    def _check_tuning(cls, value: str) -> str:
        parse_tuning(value)
        return value


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
