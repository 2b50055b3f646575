"""The Kubernetes test rig (a real control plane, the test kubelet, the real node, the OCI
registry) and its pytest plugin: used by the tests and by bench/."""
