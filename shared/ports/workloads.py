"""Wire-independent models of the runtime port: what a workload is and where its daemon listens."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from shared.models.network import OPEN, NetworkPolicy

# Labels every workload carries, in Kubernetes label syntax (also used by the local runtime).
LABEL_SANDBOX_ID = "torpor.dev/sandbox-id"
LABEL_OWNER = "torpor.dev/owner"
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY = "torpor"
# The last snapshot (``shared.models.snapshots``) lives in this annotation on the ReplicaSet.
ANNOTATION_SNAPSHOT = "torpor.dev/snapshot"
# Which snapshot the current pod has already replayed (keyed by snapshot id: replay once).
ANNOTATION_REPLAYED = "torpor.dev/replayed-snapshot"
# A workload started from a stored snapshot: its files were restored (the snapshot id).
ANNOTATION_RESTORED = "torpor.dev/restored-snapshot"
# The workload's network policy (JSON of NetworkPolicy), where a runtime keeps it on the object.
ANNOTATION_NETWORK = "torpor.dev/network"
# "true": the local runtime keeps the pod's memory on its next pause where it can; "false" or
# absent: files only. Set by the snapshotter on every pause from the pause's ``memory``
# (docs/memory-pause.md).
ANNOTATION_PAUSE_MEMORY = "torpor.dev/pause-memory"
# "false": the next pod boots from the kept files even if memory was kept (E2B's connect
# ``memory: false``, the SDK's ``on_resume="reboot"``).
ANNOTATION_RESUME_MEMORY = "torpor.dev/resume-memory"
ENVD_PORT = 49983


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class WorkloadSpec(_Frozen):
    """What to create for one sandbox."""

    name: str  # == sandbox id
    template: str = "sandbox-base"
    owner: str
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    envs: dict[str, str] = Field(default_factory=dict)
    access_token: str | None = None  # passed to the daemon (X-Access-Token)
    replicas: Literal[0, 1] = 1
    network: NetworkPolicy = OPEN  # enforced by the runtime for every pod of the workload


class Endpoint(_Frozen):
    """Where a ready pod's in-sandbox daemon listens."""

    host: str  # pod IP; always 127.0.0.N in tests and in the local runtime
    port: int = ENVD_PORT
    pod_uid: str
    # The pod came from a warm pool (claimed, not started for this request): the ``path`` of
    # the ``created``/``resumed`` events.
    warm: bool = False
    # The pod is the sandbox's paused tree restored with its memory (no replay); else, when a
    # memory pause was asked for, why its memory did not come back (the resume report says it).
    memory_kept: bool = False
    memory_note: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"


class Workload(_Frozen):
    """A ReplicaSet-shaped workload as the runtime reports it."""

    name: str
    template: str
    labels: dict[str, str]
    annotations: dict[str, str]
    replicas: int  # desired
    ready_replicas: int = 0
    resource_version: str  # opaque; pass back to patch_annotations for optimistic concurrency
    pod_uid: str | None = None  # the current (non-terminating) pod, if any
    pod_ip: str | None = None
