"""OCI images for the Kubernetes runtime: layer archives (checked and normalized), image
manifests and configs, and the distribution API client that pushes them to a registry."""
