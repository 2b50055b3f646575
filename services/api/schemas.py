"""Wire shapes. E2B models spell their JSON keys exactly as the SDK's generated client does
(``templateID``, ``sandboxID``, ``envdAccessToken``, ``allow_internet_access``…); native models
use camelCase.

Requests refuse unknown keys, and keys torpor does not enforce (``mcp``, ``iam``,
``volumeMounts``, memory snapshots, egress proxies…), with a 400 naming the field: a request is
never half-applied in silence. User values that reach a pod (env, metadata, template names,
network CIDRs) are checked by the shared rules in ``shared.models.user_input`` and
``shared.models.network``."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool

from shared.ids import SANDBOX_ID_PATTERN
from shared.models.lifecycle import Hooks
from shared.models.network import MAX_RULES, Cidr, NetworkPolicy
from shared.models.snapshot_records import SNAPSHOT_NAME_PATTERN
from shared.models.user_input import EnvVars, Metadata, TemplateName, TemplateRef


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


def _refused(reason: str) -> Callable[[Any], Any]:
    """A field torpor accepts only when it asks for nothing (absent, null, empty)."""

    def check(value: Any) -> Any:
        if value is None or value in ([], {}):
            return value
        raise ValueError(f"not supported by torpor: {reason}")

    return check


def _refuse_true(reason: str) -> Callable[[bool | None], bool | None]:
    def check(value: bool | None) -> bool | None:
        if value is True:
            raise ValueError(f"not supported by torpor: {reason}")
        return value

    return check


_NO_MEMORY = (
    "a memory image here (only a pause keeps memory: the pause's memory or autoPauseMemory at "
    "create; use false or omit)"
)
Unsupported = Any
NoMemory = Annotated[bool | None, AfterValidator(_refuse_true(_NO_MEMORY))]


class _Out(BaseModel):
    model_config = ConfigDict(populate_by_name=True, frozen=True)


class ErrorBody(_Out):
    code: int = Field(description="The HTTP status code, repeated")
    message: str


# ---------------------------------------------------------------- E2B requests


class AutoResumeConfig(_In):
    enabled: bool = False


class LifecycleIn(_In):
    """The object form some SDKs send instead of ``autoPause``/``autoResume``."""

    on_timeout: Literal["pause", "kill"] | None = Field(default=None, alias="onTimeout")
    auto_resume: bool | None = Field(default=None, alias="autoResume")


# The egress fields create's ``network`` and ``PUT /network`` share, one definition each.
AllowOut = Annotated[tuple[Cidr, ...] | None, Field(alias="allowOut", max_length=MAX_RULES)]
DenyOut = Annotated[tuple[Cidr, ...] | None, Field(alias="denyOut", max_length=MAX_RULES)]
NoRules = Annotated[Unsupported, AfterValidator(_refused("per-host egress rules"))]
NoEgressProxy = Annotated[
    Unsupported, AfterValidator(_refused("egress proxies")), Field(alias="egressProxy")
]
NoDnsServers = Annotated[
    Unsupported,
    AfterValidator(_refused("DNS servers (domains in allowOut are refused)")),
    Field(alias="dnsServers"),
]


class NetworkIn(_In):
    """``network`` on create: egress CIDRs and public traffic. Domain names, per-host rules,
    egress proxies and the other E2B network features are refused: nothing would enforce them."""

    allow_out: AllowOut = None
    deny_out: DenyOut = None
    allow_public_traffic: bool | None = Field(default=None, alias="allowPublicTraffic")
    rules: NoRules = None
    egress_proxy: NoEgressProxy = None
    dns_servers: NoDnsServers = None
    mask_request_host: Annotated[Unsupported, AfterValidator(_refused("request host masking"))] = (
        Field(default=None, alias="maskRequestHost")
    )
    https_ports: Annotated[Unsupported, AfterValidator(_refused("HTTPS ports"))] = Field(
        default=None, alias="httpsPorts"
    )


class NetworkUpdate(_In):
    """``PUT /sandboxes/{id}/network`` (SDK ``update_network``): replaces the egress rules; an
    omitted field is cleared (E2B). ``allowPublicTraffic`` is not part of it and is kept."""

    allow_out: AllowOut = None
    deny_out: DenyOut = None
    allow_internet_access: bool | None = None
    rules: NoRules = None
    egress_proxy: NoEgressProxy = None
    dns_servers: NoDnsServers = None

    def policy(self, *, allow_public_traffic: bool) -> NetworkPolicy:
        return NetworkPolicy(
            allow_internet=self.allow_internet_access is not False,
            allow_out=self.allow_out or (),
            deny_out=self.deny_out or (),
            allow_public_traffic=allow_public_traffic,
        )


class NewSandbox(_In):
    template_id: TemplateRef = Field(default="base", alias="templateID")
    timeout: int | None = Field(default=None, ge=1, le=2**31 - 1)
    auto_pause: bool | None = Field(default=None, alias="autoPause")
    # true: a timeout pause keeps memory where the runtime can (as a pause with memory: true);
    # absent or false: files only. Only meaningful with autoPause; kept either way.
    auto_pause_memory: StrictBool | None = Field(default=None, alias="autoPauseMemory")
    auto_resume: AutoResumeConfig | bool | None = Field(default=None, alias="autoResume")
    lifecycle: LifecycleIn | None = None
    secure: bool | None = None  # false: no access token (docs/security.md, "secure=False")
    allow_internet_access: bool | None = None
    network: NetworkIn | None = None
    metadata: Metadata | None = None
    env_vars: EnvVars | None = Field(default=None, alias="envVars")
    hooks: Hooks | None = Field(
        default=None,
        description="torpor: lifecycle hooks (prePause, postResume, preKill), after the template's",
    )
    mcp: Annotated[Unsupported, AfterValidator(_refused("MCP gateways"))] = None
    iam: Annotated[Unsupported, AfterValidator(_refused("workload identity tokens"))] = None
    volume_mounts: Annotated[
        Unsupported, AfterValidator(_refused("volume mounts (volumes come from the template)"))
    ] = Field(default=None, alias="volumeMounts")

    def network_policy(self) -> NetworkPolicy:
        net = self.network or NetworkIn()
        return NetworkPolicy(
            allow_internet=self.allow_internet_access is not False,
            allow_out=net.allow_out or (),
            deny_out=net.deny_out or (),
            allow_public_traffic=(
                True if net.allow_public_traffic is None else net.allow_public_traffic
            ),
        )

    def wants_auto_pause(self) -> bool:
        if self.auto_pause is not None:
            return self.auto_pause
        return bool(self.lifecycle and self.lifecycle.on_timeout == "pause")

    def wants_auto_resume(self) -> bool:
        if isinstance(self.auto_resume, AutoResumeConfig):
            return self.auto_resume.enabled
        if isinstance(self.auto_resume, bool):
            return self.auto_resume
        return bool(self.lifecycle and self.lifecycle.auto_resume)


# Connect's and resume's ``memory``: absent or true restores a memory-keeping pause's processes
# (E2B's ``on_resume="restore"``); false boots from the kept files and replays the process list
# (``on_resume="reboot"``; the images are dropped). Nothing to choose after a files-only pause.
ResumeMemory = StrictBool | None


class ConnectSandbox(_In):
    timeout: int | None = Field(default=None, ge=0, le=2**31 - 1)
    memory: ResumeMemory = None


class ResumedSandbox(_In):
    timeout: int | None = Field(default=None, ge=0, le=2**31 - 1)
    # E2B's deprecated field: given, it sets whether the resumed sandbox pauses on timeout.
    auto_pause: StrictBool | None = Field(default=None, alias="autoPause")
    memory: ResumeMemory = None


class PauseRequest(_In):
    # true (the JS SDK's default, the Python SDK's ``mode="full"``): keep the processes' memory
    # where the runtime can (local runtime with CRIU; else files only and the resume report says
    # why). Absent or false: files only, the processes are replayed on resume.
    memory: StrictBool = False
    require_healthy_guest: bool | None = Field(default=None, alias="requireHealthyGuest")


class TimeoutRequest(_In):
    timeout: int = Field(ge=0, le=2**31 - 1)


class RefreshRequest(_In):
    duration: int | None = Field(default=None, ge=0, le=3600)


# ---------------------------------------------------------------- resume report (both APIs)


class ProcessOutcomeOut(_Out):
    cmd: str
    args: list[str]
    tag: str | None = None
    old_pid: int = Field(alias="oldPid", description="Its pid when the snapshot was taken")
    new_pid: int | None = Field(default=None, alias="newPid", description="Its pid now")
    error: str | None = Field(default=None, description="Why it is not running again")


class ResumeTimingsOut(_Out):
    claim_ms: float = Field(alias="claimMs")
    pod_ms: float = Field(alias="podMs", description="Scale to 1 until the daemon answers")
    files_ms: float = Field(alias="filesMs", description="0: the files were kept in place")
    replay_ms: float = Field(alias="replayMs", description="List what runs, start the rest")
    hooks_ms: float = Field(default=0.0, alias="hooksMs", description="The postResume hooks")
    total_ms: float = Field(alias="totalMs")


class HookOutcomeOut(_Out):
    hook: Literal["prePause", "postResume", "preKill"]
    source: Literal["template", "sandbox"]
    policy: Literal["abort", "ignore"]
    ok: bool
    exit_code: int | None = Field(default=None, alias="exitCode")
    duration_ms: float = Field(alias="durationMs")
    output: str = Field(description="The tail of its output, secrets masked")
    error: str | None = None
    aborted: bool


class ResumeReportOut(_Out):
    """What the last resume restored (torpor extension; E2B SDKs ignore unknown keys)."""

    at: datetime
    path: Literal["warm", "cold"] = Field(description="warm: the pod came from a pool")
    snapshot_id: str | None = Field(default=None, alias="snapshotId")
    template: str
    template_version: str | None = Field(default=None, alias="templateVersion")
    files_kept: bool = Field(alias="filesKept")
    memory_kept: bool = Field(
        default=False, alias="memoryKept", description="false: processes were started again"
    )
    memory_note: str | None = Field(
        default=None, alias="memoryNote", description="What the resume did not keep, and why"
    )
    processes: list[ProcessOutcomeOut]
    omitted: int = Field(default=0, description="Processes beyond the report's 32 KiB: not listed")
    replayed: int
    failed: int
    timings: ResumeTimingsOut
    hooks: list[HookOutcomeOut] = Field(default_factory=list, description="postResume hooks")


# ---------------------------------------------------------------- E2B responses


class SandboxOut(_Out):
    """``Sandbox`` (create / connect / resume)."""

    template_id: str = Field(alias="templateID")
    sandbox_id: str = Field(alias="sandboxID")
    client_id: str = Field(alias="clientID")
    envd_version: str = Field(alias="envdVersion")
    envd_access_token: str | None = Field(default=None, alias="envdAccessToken")
    traffic_access_token: str | None = Field(default=None, alias="trafficAccessToken")
    domain: str | None = None
    alias: str | None = None
    resume_report: ResumeReportOut | None = Field(
        default=None,
        alias="resumeReport",
        description="connect and resume, when the call resumed the sandbox: what was restored",
    )


class LifecycleOut(_Out):
    auto_resume: bool = Field(alias="autoResume")
    on_timeout: Literal["kill", "pause"] = Field(alias="onTimeout")


class ListedSandboxOut(_Out):
    template_id: str = Field(alias="templateID")
    alias: str | None = None
    sandbox_id: str = Field(alias="sandboxID")
    client_id: str = Field(alias="clientID")
    started_at: datetime = Field(alias="startedAt")
    end_at: datetime = Field(alias="endAt")
    cpu_count: int = Field(alias="cpuCount")
    memory_mb: int = Field(alias="memoryMB")
    disk_size_mb: int = Field(alias="diskSizeMB")
    metadata: dict[str, str] = Field(default_factory=dict)
    state: Literal["running", "paused"]
    envd_version: str = Field(alias="envdVersion")


class NetworkOut(_Out):
    allow_out: list[str] = Field(alias="allowOut")
    deny_out: list[str] = Field(alias="denyOut")
    allow_public_traffic: bool = Field(alias="allowPublicTraffic")


class SandboxDetailOut(ListedSandboxOut):
    envd_access_token: str | None = Field(default=None, alias="envdAccessToken")
    domain: str | None = None
    allow_internet_access: bool | None = Field(default=None, alias="allowInternetAccess")
    network: NetworkOut | None = None
    lifecycle: LifecycleOut


class MetricOut(_Out):
    timestamp: datetime
    timestamp_unix: int = Field(alias="timestampUnix")
    cpu_count: int = Field(alias="cpuCount")
    cpu_used_pct: float = Field(alias="cpuUsedPct")
    mem_used: int = Field(alias="memUsed")
    mem_total: int = Field(alias="memTotal")
    mem_cache: int = Field(default=0, alias="memCache")
    disk_used: int = Field(alias="diskUsed")
    disk_total: int = Field(alias="diskTotal")


class SandboxesWithMetricsOut(_Out):
    sandboxes: dict[str, MetricOut] = Field(default_factory=dict)


class SandboxLogLineOut(_Out):
    timestamp: datetime
    line: str


class SandboxLogEntryOut(_Out):
    timestamp: datetime
    level: Literal["debug", "info", "warn", "error"]
    message: str
    fields: dict[str, str] = Field(default_factory=dict)


class SandboxLogsOut(_Out):
    logs: list[SandboxLogLineOut] = Field(default_factory=list)
    log_entries: list[SandboxLogEntryOut] = Field(default_factory=list, alias="logEntries")


class SandboxLogsV2Out(_Out):
    logs: list[SandboxLogEntryOut] = Field(default_factory=list)


# ---------------------------------------------------------------- native API


class NativeCreate(_In):
    name: str | None = Field(
        default=None,
        pattern=SANDBOX_ID_PATTERN,
        description=(
            "The sandbox name (lowercase DNS label), unique among your sandboxes; the "
            "sandbox id is derived from it (sandboxId). When omitted, the id is generated"
        ),
    )
    template: TemplateName = "sandbox-base"
    timeout: int = Field(default=300, ge=1, le=2**31 - 1, description="Inactivity timeout, s")
    auto_pause: bool = Field(default=False, alias="autoPause")
    auto_resume: bool = Field(default=False, alias="autoResume")
    metadata: Metadata = Field(default_factory=dict)
    envs: EnvVars = Field(default_factory=dict)
    hooks: Hooks | None = Field(
        default=None, description="Lifecycle hooks (prePause, postResume, preKill)"
    )


class SnapshotOut(_Out):
    annotation: str = Field(description="base64 of the snapshot JSON (the ReplicaSet annotation)")
    captured_at: str = Field(alias="capturedAt")
    process_count: int = Field(alias="processCount")


class NativeSandbox(_Out):
    name: str = Field(description="The name given at create (unique per user), else the id")
    sandbox_id: str = Field(
        alias="sandboxId", description="The id for the E2B API, the SDK and the proxy"
    )
    owner: str
    template: str
    state: str = Field(description="The real state, including transitional ones")
    timeout: int
    auto_pause: bool = Field(alias="autoPause")
    auto_resume: bool = Field(alias="autoResume")
    metadata: dict[str, str]
    created_at: datetime = Field(alias="createdAt")
    started_at: datetime = Field(alias="startedAt")
    deadline: datetime | None = None
    paused_at: datetime | None = Field(default=None, alias="pausedAt")
    retain_until: datetime | None = Field(default=None, alias="retainUntil")
    snapshot: SnapshotOut | None = None
    failure: str | None = None
    envd_access_token: str | None = Field(default=None, alias="envdAccessToken")
    last_resume: ResumeReportOut | None = Field(
        default=None, alias="lastResume", description="What the last resume restored"
    )
    hooks: Hooks | None = Field(default=None, description="The sandbox's own lifecycle hooks")
    refused_pause: HookOutcomeOut | None = Field(
        default=None, alias="refusedPause", description="The prePause that refused a pause"
    )


class NativeList(_Out):
    sandboxes: list[NativeSandbox]


# ---------------------------------------------------------------- snapshots and fork (E2B)

MAX_FORK_COUNT = 20  # E2B's bound (the SDK refuses others before sending)


class SnapshotRequest(_In):
    """``POST /sandboxes/{id}/snapshots``. ``memory: false`` is E2B's filesystem-only snapshot
    (sandboxes from it start without the processes); ``memory: true`` asks for a memory image,
    which torpor does not make (its snapshots replay the process list): refused."""

    name: str | None = Field(default=None, pattern=SNAPSHOT_NAME_PATTERN)
    memory: NoMemory = None


class ForkRequest(_In):
    timeout: int | None = Field(default=None, ge=0, le=2**31 - 1)
    count: int | None = Field(default=None, ge=1, le=MAX_FORK_COUNT)


class SnapshotInfoOut(_Out):
    snapshot_id: str = Field(alias="snapshotID")
    names: list[str]


class ForkErrorOut(_Out):
    code: int
    message: str


class ForkResultOut(_Out):
    """One per requested fork: the started sandbox, or why it did not start."""

    sandbox: SandboxOut | None = None
    error: ForkErrorOut | None = None
