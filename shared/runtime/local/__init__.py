"""The local runtime adapter: bubblewrap-isolated pods on loopback, records in NATS KV."""

from shared.runtime.local.workloads import LocalRuntime

__all__ = ["LocalRuntime"]
