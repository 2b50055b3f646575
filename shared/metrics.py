"""Declaring a service's Prometheus metrics on the registry of its process
(``shared.lifecycle.hosting.Context.registry``), never as module globals: each metric is one line
of name, help and label names."""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Declare:
    """Makes metrics on one registry: ``Declare(registry).counter(name, doc, "label", ...)``."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def counter(self, name: str, doc: str, *labels: str) -> Counter:
        return Counter(name, doc, labels, registry=self._registry)

    def gauge(self, name: str, doc: str, *labels: str) -> Gauge:
        return Gauge(name, doc, labels, registry=self._registry)

    def histogram(
        self, name: str, doc: str, *labels: str, buckets: Sequence[float | str]
    ) -> Histogram:
        return Histogram(name, doc, labels, buckets=buckets, registry=self._registry)
