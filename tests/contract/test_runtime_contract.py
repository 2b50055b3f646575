"""The runtime port's contract: every adapter (local, kubernetes) passes this same suite.

Pods are real (bubblewrap processes or Kubernetes pods running the in-sandbox daemon); the test
talks to each pod's daemon over loopback with plain HTTP (``/health``, ``/files``).
"""

from __future__ import annotations

import asyncio
import ipaddress
import uuid

import pytest

from shared.errors import Conflict, NotFound, PodNotReady
from shared.ports.workloads import (
    ANNOTATION_SNAPSHOT,
    LABEL_OWNER,
    LABEL_SANDBOX_ID,
    WorkloadSpec,
)
from tests.contract.harness import RuntimeHarness, healthy, read_file, write_file

pytestmark = pytest.mark.timeout(180)


def new_name() -> str:
    return f"sbx-{uuid.uuid4().hex[:10]}"


def spec(name: str, *, owner: str = "alice", replicas: int = 0, **kw: object) -> WorkloadSpec:
    return WorkloadSpec(name=name, owner=owner, replicas=replicas, **kw)  # type: ignore[arg-type]


async def test_pause_resume_lifecycle(runtime: RuntimeHarness) -> None:
    rt, name = runtime.runtime, new_name()
    created = await rt.create(spec(name, annotations={"a": "1"}))
    assert created.replicas == 0
    assert created.labels[LABEL_SANDBOX_ID] == name
    assert created.labels[LABEL_OWNER] == "alice"

    await rt.scale(name, 1)
    first = await rt.wait_ready(name, timeout=runtime.ready_timeout)
    assert ipaddress.ip_address(first.host)  # a pod IP (its own namespace's, or a test kubelet's)
    assert await healthy(first)
    await write_file(first, "/workspace/notes.txt", b"before pause")
    assert await read_file(first, "/workspace/notes.txt") == b"before pause"

    current = await rt.get(name)
    assert current is not None
    assert current.pod_uid == first.pod_uid
    patched = await rt.patch_annotations(
        name, {ANNOTATION_SNAPSHOT: "c25hcHNob3Q="}, resource_version=current.resource_version
    )
    assert patched.annotations == {"a": "1", ANNOTATION_SNAPSHOT: "c25hcHNob3Q="}
    assert patched.resource_version != current.resource_version

    await rt.scale(name, 0)
    await rt.wait_stopped(name, timeout=runtime.ready_timeout)
    paused = await rt.get(name)
    assert paused is not None
    assert paused.replicas == 0
    assert paused.pod_uid is None
    assert paused.ready_replicas == 0
    assert paused.annotations[ANNOTATION_SNAPSHOT] == "c25hcHNob3Q="
    assert not await healthy(first), "the paused pod still answers"

    await rt.scale(name, 1)
    second = await rt.wait_ready(name, timeout=runtime.ready_timeout)
    assert second.pod_uid != first.pod_uid
    kept = await read_file(second, "/workspace/notes.txt")
    # Both runtimes keep a sandbox's files across a pause (local: its kept layer; Kubernetes:
    # its claim); ``persist: none`` templates, tested per runtime, opt out.
    assert kept == b"before pause", "/workspace was lost in the pause"
    resumed = await rt.get(name)
    assert resumed is not None
    assert resumed.ready_replicas == 1
    assert resumed.pod_uid == second.pod_uid

    await rt.delete(name)
    assert await rt.get(name) is None
    assert not await healthy(second)


async def test_concurrent_annotation_updates_one_wins(runtime: RuntimeHarness) -> None:
    rt, name = runtime.runtime, new_name()
    version = (await rt.create(spec(name))).resource_version
    results = await asyncio.gather(
        rt.patch_annotations(name, {"writer": "one"}, resource_version=version),
        rt.patch_annotations(name, {"writer": "two"}, resource_version=version),
        return_exceptions=True,
    )
    conflicts = [r for r in results if isinstance(r, Conflict)]
    winners = [r for r in results if not isinstance(r, BaseException)]
    assert len(conflicts) == 1, results
    assert len(winners) == 1, results
    stored = await rt.get(name)
    assert stored is not None
    assert stored.annotations["writer"] == winners[0].annotations["writer"]
    with pytest.raises(Conflict):
        await rt.patch_annotations(name, {"writer": "late"}, resource_version=version)
    await rt.delete(name)


async def test_patch_without_version_merges_and_removes(runtime: RuntimeHarness) -> None:
    rt, name = runtime.runtime, new_name()
    await rt.create(spec(name, annotations={"keep": "k", "drop": "d"}))
    patched = await rt.patch_annotations(name, {"drop": None, "new": "n"})
    assert patched.annotations == {"keep": "k", "new": "n"}
    await rt.delete(name)


async def test_scale_up_while_previous_pod_is_stopping(runtime: RuntimeHarness) -> None:
    rt, name = runtime.runtime, new_name()
    await rt.create(spec(name, replicas=1))
    old = await rt.wait_ready(name, timeout=runtime.ready_timeout)
    await rt.scale(name, 0)
    await rt.scale(name, 1)  # no wait_stopped in between
    new = await rt.wait_ready(name, timeout=runtime.ready_timeout)
    assert new.pod_uid != old.pod_uid
    assert await healthy(new)
    current = await rt.get(name)
    assert current is not None
    assert current.pod_uid == new.pod_uid
    assert current.replicas == 1
    await rt.delete(name)


async def test_pod_that_never_becomes_ready_times_out(runtime: RuntimeHarness) -> None:
    rt, name = runtime.runtime, new_name()
    await rt.create(spec(name, replicas=1, template=runtime.never_ready_template))
    loop = asyncio.get_running_loop()
    started = loop.time()
    with pytest.raises(PodNotReady):
        await rt.wait_ready(name, timeout=3)
    assert loop.time() - started < 3 + 10, "wait_ready overran its timeout"
    await rt.delete(name)
    assert await rt.get(name) is None


async def test_list_by_owner_label(runtime: RuntimeHarness) -> None:
    rt = runtime.runtime
    alice = [new_name(), new_name()]
    bob = new_name()
    for name in alice:
        await rt.create(spec(name, owner="alice"))
    await rt.create(spec(bob, owner="bob"))
    listed = {w.name for w in await rt.list(labels={LABEL_OWNER: "alice"})}
    assert set(alice) <= listed
    assert bob not in listed
    everyone = {w.name for w in await rt.list()}
    assert {*alice, bob} <= everyone
    only_bob = await rt.list(labels={LABEL_OWNER: "bob", LABEL_SANDBOX_ID: bob})
    assert [w.name for w in only_bob] == [bob]
    for name in [*alice, bob]:
        await rt.delete(name)
    assert not {w.name for w in await rt.list()} & {*alice, bob}


async def test_create_is_idempotent(runtime: RuntimeHarness) -> None:
    rt, name = runtime.runtime, new_name()
    first = await rt.create(spec(name, annotations={"x": "1"}))
    again = await rt.create(spec(name, annotations={"x": "2"}))
    assert again.name == first.name
    assert again.annotations == {"x": "1"}
    await rt.delete(name)


async def test_delete_is_idempotent_and_get_of_missing_is_none(runtime: RuntimeHarness) -> None:
    rt, name = runtime.runtime, new_name()
    assert await rt.get(name) is None
    await rt.delete(name)  # never existed
    await rt.create(spec(name, replicas=1))
    await rt.wait_ready(name, timeout=runtime.ready_timeout)
    await rt.delete(name)
    await rt.delete(name)
    assert await rt.get(name) is None


async def test_missing_workload_and_template_are_not_found(runtime: RuntimeHarness) -> None:
    rt, name = runtime.runtime, new_name()
    with pytest.raises(NotFound):
        await rt.scale(name, 1)
    with pytest.raises(NotFound):
        await rt.patch_annotations(name, {"a": "b"})
    with pytest.raises(NotFound):
        await rt.create(spec(name, template="no-such-template"))
    assert await rt.get(name) is None
