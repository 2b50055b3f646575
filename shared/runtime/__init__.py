"""The runtime port (ReplicaSet-shaped workloads) and its adapters."""
