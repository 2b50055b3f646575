"""The builder's garbage collection (``services.builder.collecting``) on a real folder, with
in-memory stand-ins for the records it reads (the fast tier; the end-to-end proof with the SDK
is tests/templates/test_gc.py)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml

from services.builder.collecting import Collector, Policy
from shared.domain.record import SandboxRecord
from shared.domain.states import SandboxState
from shared.models.snapshot_records import SnapshotRecord
from shared.models.template_records import (
    BUILT_TEMPLATES_DIR,
    TEMPLATE_FILES_DIR,
    Artifact,
    BuildRecord,
    BuildSpec,
    BuildStatus,
    Step,
    blob_path,
)
from shared.runtime.local import template_layers

NOW = 1_900_000_000.0
T = datetime.now(UTC)
K = [f"{i:064x}" for i in range(1, 10)]  # layer keys
HASH = "ab" * 32


@dataclass
class Records:
    builds: list[BuildRecord] = field(default_factory=list)
    workload_templates: set[str] = field(default_factory=set)
    sandboxes: list[SandboxRecord] = field(default_factory=list)
    snapshots: list[SnapshotRecord] = field(default_factory=list)

    async def list_all_builds(self) -> list[BuildRecord]:
        return list(self.builds)

    async def templates_in_use(self) -> set[str]:
        return set(self.workload_templates)


@dataclass
class SandboxList:
    records: Records

    async def list(self) -> list[SandboxRecord]:
        return list(self.records.sandboxes)


@dataclass
class SnapshotList:
    records: Records

    async def list(self) -> list[SnapshotRecord]:
        return list(self.records.snapshots)


def collector(data: Path, records: Records, **policy: float) -> Collector:
    return Collector(
        data_dir=data,
        builds=records,
        workloads=records,
        sandboxes=SandboxList(records),
        snapshots=SnapshotList(records),
        policy=Policy(**{"grace": 100.0, "cache_max_age": 1000.0, **policy}),  # type: ignore[arg-type]
    )


def layer(data: Path, key: str, *, used: float = NOW, size: int = 10) -> Path:
    tree = template_layers.tree(data, key)
    tree.mkdir(parents=True)
    (tree / "file").write_bytes(b"x" * size)
    os.utime(tree.parent, (used, used))
    return tree.parent


def template_file(data: Path, name: str, layers: list[str]) -> Path:
    folder = data / BUILT_TEMPLATES_DIR
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "layers": layers}))
    return path


def build(
    build_id: str, layers: list[str] | None, *, status: BuildStatus = BuildStatus.READY
) -> BuildRecord:
    spec = BuildSpec(base="debian", steps=[Step(type="COPY", args=["a", "b"], files_hash=HASH)])
    return BuildRecord(
        build_id=build_id,
        template_id="t" * 20,
        owner="alice",
        status=status,
        spec=spec,
        artifact=Artifact(layers=layers) if layers is not None else None,
        created_at=T,
        updated_at=T,
    )


def sandbox(template: str, state: SandboxState) -> SandboxRecord:
    return SandboxRecord.model_validate(
        {
            "sandbox_id": f"sbx{abs(hash((template, state))) % 10**8}",
            "owner": "alice",
            "state": state,
            "template": template,
            "created_at": T,
            "started_at": T,
            "updated_at": T,
        }
    )


async def test_a_deleted_builds_files_go_after_the_grace_and_kept_ones_stay(tmp_path: Path) -> None:
    data = tmp_path
    records = Records(builds=[build("bkept", [K[0], K[1]])])
    for key in K[:3]:
        layer(data, key)
    kept = template_file(data, "bkept", [K[0], K[1]])
    gone = template_file(data, "bgone", [K[0], K[2]])  # its build was deleted
    gc = collector(data, records)

    first = await gc.sweep(NOW)
    assert first.swept and first.removed == {}
    assert gone.exists() and template_layers.exists(data, K[2])  # within the grace
    second = await gc.sweep(NOW + 101)
    assert second.removed == {"layers": 1, "template_files": 1}
    assert not gone.exists() and not template_layers.exists(data, K[2])
    assert (
        kept.exists() and template_layers.exists(data, K[0]) and template_layers.exists(data, K[1])
    )
    assert second.layer_bytes == 20 and second.freed_bytes == 10


@pytest.mark.parametrize(
    "user",
    ["workload", "running sandbox", "paused sandbox", "creating sandbox", "stored snapshot"],
)
async def test_a_deleted_template_in_use_keeps_its_files(tmp_path: Path, user: str) -> None:
    data = tmp_path
    layer(data, K[0])
    path = template_file(data, "bdel", [K[0]])
    records = Records()
    if user == "workload":
        records.workload_templates = {"bdel"}
    elif user == "stored snapshot":
        records.snapshots = [
            SnapshotRecord(
                snapshot_id="snap1",
                owner="alice",
                source_sandbox_id="sbx1",
                template="bdel",
                created_at=T,
                retain_until=T,
                updated_at=T,
            )
        ]
    else:
        state = {
            "running sandbox": SandboxState.RUNNING,
            "paused sandbox": SandboxState.PAUSED,
            "creating sandbox": SandboxState.CREATING,
        }[user]
        records.sandboxes = [sandbox("bdel", state)]
    gc = collector(data, records)
    await gc.sweep(NOW)
    report = await gc.sweep(NOW + 10_000)
    assert report.removed == {}
    assert path.exists() and template_layers.exists(data, K[0])
    # Once its last user is gone (a killed sandbox's tombstone is no user), the files go.
    records.workload_templates, records.snapshots = set(), []
    records.sandboxes = [sandbox("bdel", SandboxState.KILLED)]
    await gc.sweep(NOW + 10_001)
    await gc.sweep(NOW + 10_200)
    assert not path.exists() and not template_layers.exists(data, K[0])


async def test_cache_entries_go_by_age_then_least_recently_used_beyond_the_size(
    tmp_path: Path,
) -> None:
    data = tmp_path
    layer(data, K[0], used=NOW - 5000, size=1000)  # past the age
    layer(data, K[1], used=NOW - 30, size=1000)  # least recently used of the rest
    layer(data, K[2], used=NOW - 20, size=1000)
    layer(data, K[3], used=NOW - 10, size=1000)
    staging = template_layers.staging(data)
    (staging / "tree" / "partial").write_text("half a layer of a failed build")
    report = await collector(data, Records(), cache_max_bytes=2500).sweep(NOW)
    assert report.removed == {"cache": 2, "staging": 1}
    assert [template_layers.exists(data, k) for k in K[:4]] == [False, False, True, True]
    assert not staging.exists()
    assert report.cache_bytes == 2000


async def test_a_reused_cache_entry_counts_as_recently_used(tmp_path: Path) -> None:
    data = tmp_path
    layer(data, K[0], used=NOW - 5000)
    template_layers.touch(data, K[0])  # what a build does when it reports a step CACHED
    report = await collector(data, Records()).sweep(time.time())
    assert report.removed == {} and template_layers.exists(data, K[0])


async def test_nothing_is_swept_while_a_build_runs(tmp_path: Path) -> None:
    data = tmp_path
    layer(data, K[0], used=NOW - 5000)
    staging = template_layers.staging(data)
    with template_layers.in_use_by_a_build(data):
        report = await collector(data, Records()).sweep(NOW)
    assert not report.swept
    assert template_layers.exists(data, K[0]) and staging.exists()
    # Two builds at once share the hold.
    held = threading.Event()
    with template_layers.in_use_by_a_build(data):

        def second() -> None:
            with template_layers.in_use_by_a_build(data):
                held.set()

        thread = threading.Thread(target=second)
        thread.start()
        thread.join(10)
    assert held.is_set()


async def test_uploads_no_build_waits_for_go_after_their_age(tmp_path: Path) -> None:
    data = tmp_path
    root = data / TEMPLATE_FILES_DIR
    waited_for = blob_path(root, "alice", HASH)
    old = blob_path(root, "alice", "cd" * 32)
    fresh = blob_path(root, "bob", "ef" * 32)
    partial = old.with_name(".cdcd.1.2.partial")
    for path in (waited_for, old, fresh, partial):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"tar" * 100)
    for path in (waited_for, old, partial):
        os.utime(path, (NOW - 7200, NOW - 7200))
    os.utime(fresh, (NOW - 10, NOW - 10))
    records = Records(builds=[build("bwait", None, status=BuildStatus.WAITING)])
    report = await collector(data, records, upload_max_age=3600).sweep(NOW)
    assert report.removed == {"uploads": 2}
    assert waited_for.exists() and fresh.exists()
    assert not old.exists() and not partial.exists()
    assert report.upload_bytes == 600


async def test_hostile_entries_are_never_followed(tmp_path: Path) -> None:
    """A template file listing paths instead of keys, and a link in the layers folder: the
    collection removes neither what the paths name nor what the link points at."""
    data = tmp_path / "data"
    outside = tmp_path / "outside"
    (outside / "tree").mkdir(parents=True)
    (outside / "tree" / "precious").write_text("not the builder's")
    template_layers.root(data).mkdir(parents=True)
    (template_layers.root(data) / K[5]).symlink_to(outside)
    template_file(data, "bhostile", ["../../outside", "--ro-bind", "\x00", K[5]])
    gc = collector(data, Records(), grace=0)
    await gc.sweep(NOW)
    await gc.sweep(NOW + 1)
    assert (outside / "tree" / "precious").read_text() == "not the builder's"
    assert not (template_layers.root(data) / K[5]).is_symlink()
    assert not (data / BUILT_TEMPLATES_DIR / "bhostile.yaml").exists()
