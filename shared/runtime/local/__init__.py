"""The local runtime adapter: bubblewrap-isolated pods, each in its own network namespace, with
records in NATS KV."""

from shared.runtime.local.workloads import LocalRuntime

__all__ = ["LocalRuntime"]
