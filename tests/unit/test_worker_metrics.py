"""Workers make their metrics on the registry they are given (``Context.registry``), not as module
globals: two hosts in one process count apart, and what one counts is served by its registry."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from services.scaler.metrics import ScalerMetrics
from services.scheduler.metrics import SchedulerMetrics
from services.snapshotter.metrics import SnapshotterMetrics
from shared.lifecycle.hosting import Context
from shared.settings import BusSettings

pytestmark = pytest.mark.unit


def test_two_hosts_in_one_process_count_apart() -> None:
    first, second = Context(bus=BusSettings()), Context(bus=BusSettings())
    assert first.registry is not second.registry
    ScalerMetrics(first.registry).observe("resume", "done", 0.2)
    ScalerMetrics(second.registry)  # would raise "Duplicated timeseries" on one shared registry
    SnapshotterMetrics(first.registry).snapshots.labels("skipped").inc()
    SnapshotterMetrics(second.registry)
    assert 'torpor_snapshots_total{outcome="skipped"} 1.0' in _text(first.registry)
    assert 'torpor_transitions_total{op="resume",outcome="done"} 1.0' in _text(first.registry)
    assert 'op="resume"' not in _text(second.registry)


def test_the_scheduler_counts_on_its_registry_only() -> None:
    mine, other = CollectorRegistry(), CollectorRegistry()
    SchedulerMetrics(mine).armed.labels("deadline").inc(3)
    SchedulerMetrics(other)
    assert 'torpor_scheduler_timers_armed_total{kind="deadline"} 3.0' in _text(mine)
    assert 'kind="deadline"' not in _text(other)


def _text(registry: CollectorRegistry) -> str:
    return generate_latest(registry).decode()
