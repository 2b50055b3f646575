"""The Kubernetes builder's parts (services/builder/pod_diff.py, oci_copy.py, oci_plans.py): a
step's diff with OCI whiteouts, COPY's tar with Docker's rules and hostile paths refused, and the
plan's step keys (per owner and per base)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from datetime import UTC, datetime
from pathlib import Path

import pytest

from services.builder import oci_copy, pod_diff
from services.builder.builds import State
from services.builder.oci_plans import Parent, plan
from shared.models.template_records import BuildRecord, BuildSpec, Step
from shared.oci.images import Image
from shared.oci.layers import repack


def _members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar}


def test_a_steps_diff_is_its_changes_and_whiteouts(tmp_path: Path) -> None:
    root = tmp_path / "root"
    for folder in ("etc", "var/cache/apt", "opt/old/deep", "home/user", "proc"):
        (root / folder).mkdir(parents=True)
    (root / "etc/keep.conf").write_text("same\n")
    (root / "etc/edit.conf").write_text("before\n")
    (root / "etc/gone.conf").write_text("x\n")
    (root / "opt/old/deep/file").write_text("x\n")
    (root / "var/cache/apt/pkg").write_text("x\n")
    (root / "home/user/mode.sh").write_text("#!/bin/sh\n")
    (root / "proc/ignored").write_text("never walked\n")
    state = tmp_path / "state" / "state.json"
    assert pod_diff.main(["snap", str(root), str(state)]) == 0

    (root / "etc/edit.conf").write_text("after, longer\n")
    (root / "etc/gone.conf").unlink()
    (root / "opt/old/deep/file").unlink()
    (root / "opt/old/deep").rmdir()
    (root / "opt/old").rmdir()
    (root / "home/user/mode.sh").chmod(0o755)
    (root / "home/user/new.txt").write_text("new\n")
    (root / "home/user/link").symlink_to("/etc/keep.conf")
    (root / "var/cache/apt/pkg").unlink()
    (root / "var/cache/apt/pkg").mkdir()  # a file turned into a folder
    (root / "proc/ignored").write_text("changed, still never walked\n")
    out = tmp_path / "layer.tar"
    assert pod_diff.main(["diff", str(root), str(state), str(out)]) == 0

    members = _members(out)
    assert "etc/edit.conf" in members
    assert "etc/keep.conf" not in members
    assert members["etc/.wh.gone.conf"].size == 0
    assert "opt/.wh.old" in members
    assert not any(name.startswith("opt/old/") for name in members)  # covered by opt/.wh.old
    assert members["home/user/mode.sh"].mode & 0o777 == 0o755
    assert members["home/user/new.txt"].isreg()
    assert members["home/user/link"].issym()
    assert "var/cache/apt/.wh.pkg" in members
    assert members["var/cache/apt/pkg"].isdir()
    assert not any(name.startswith("proc") for name in members)
    # what the pod hands back passes the builder's own checks
    repack(out, tmp_path / "clean.tar")
    # the state moved on: nothing changed since, an empty layer
    again = tmp_path / "again.tar"
    assert pod_diff.main(["diff", str(root), str(state), str(again)]) == 0
    assert _members(again) == {}
    assert json.loads(state.read_text())["etc/edit.conf"]


def _context(tmp_path: Path, members: list[tuple[str, bytes | None]]) -> Path:
    archive = tmp_path / "context.tar"
    with tarfile.open(archive, "w") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
    return archive


def test_copy_follows_dockers_rules(tmp_path: Path) -> None:
    archive = _context(
        tmp_path,
        [
            ("app", None),
            ("app/config.txt", b"cfg\n"),
            ("app/sub", None),
            ("app/sub/x", b"x"),
            ("one.txt", b"1"),
        ],
    )
    out = tmp_path / "copy.tar"
    # one file to a name
    oci_copy.copy_tar(
        archive, out, src="one.txt", dest="renamed.txt", workdir="/home/user", owner=1000, mode=None
    )
    members = _members(out)
    assert members["home/user/renamed.txt"].uid == 1000
    assert {"home", "home/user"} <= members.keys()  # folders on the way (tar keeps existing ones)
    # a folder copies its contents, with a mode
    oci_copy.copy_tar(
        archive, out, src="app/", dest="/opt/app/", workdir="/home/user", owner=0, mode=0o600
    )
    members = _members(out)
    assert {"opt/app/config.txt", "opt/app/sub", "opt/app/sub/x"} <= members.keys()
    assert members["opt/app/config.txt"].mode == 0o600
    assert "opt/app/app" not in members
    # a glob
    oci_copy.copy_tar(archive, out, src="*.txt", dest="d/", workdir="/w", owner=1000, mode=None)
    assert "w/d/one.txt" in _members(out)
    with tarfile.open(out) as tar:
        handle = tar.extractfile("w/d/one.txt")
        assert handle is not None
        assert handle.read() == b"1"


@pytest.mark.parametrize(
    ("src", "dest"),
    [
        ("../etc/passwd", "x"),
        ("/etc/passwd", "x"),
        ("app", "../../etc/"),
        ("app", "a/../../b"),
        ("a\x00b", "x"),
        ("app", "x\x00y"),
        ("nothing-matches", "x"),
        ("", "x"),
    ],
)
def test_copy_refuses_hostile_paths(tmp_path: Path, src: str, dest: str) -> None:
    archive = _context(tmp_path, [("app", None), ("app/f", b"f")])
    with pytest.raises(oci_copy.BadCopy):
        oci_copy.copy_tar(
            archive,
            tmp_path / "o.tar",
            src=src,
            dest=dest,
            workdir="/home/user",
            owner=1000,
            mode=None,
        )


@pytest.mark.parametrize(
    "name", ["../escape", "/abs/file", "app/../../x", "app/.wh..wh..opq/x", "a\x01b"]
)
def test_copy_refuses_a_context_with_crafted_names(tmp_path: Path, name: str) -> None:
    archive = _context(tmp_path, [(name, b"payload")])
    with pytest.raises(oci_copy.BadCopy):
        oci_copy.copy_tar(
            archive, tmp_path / "o.tar", src="*", dest="x/", workdir="/w", owner=0, mode=None
        )


def test_copy_refuses_device_nodes_in_the_context(tmp_path: Path) -> None:
    archive = tmp_path / "context.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo("dev-node")
        info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
        tar.addfile(info)
    with pytest.raises(oci_copy.BadCopy):
        oci_copy.copy_tar(
            archive, tmp_path / "o.tar", src="dev-node", dest="x", workdir="/w", owner=0, mode=None
        )
    assert not os.path.exists(tmp_path / "w")


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TORPOR_BUILDER_REGISTRY", "http://registry.example"),
        ("TORPOR_BUILDER_REGISTRY", "registry.example/../other"),
        ("TORPOR_BUILDER_REGISTRY", "--ro-bind"),
        ("TORPOR_BUILDER_REGISTRY", "Registry.Example"),
        ("TORPOR_BUILDER_BASE_IMAGE", "../sandbox-base:latest"),
        ("TORPOR_BUILDER_BASE_IMAGE", "sandbox-base@sha256:abc"),
        ("TORPOR_BUILDER_BASE_IMAGE", "-x"),
    ],
)
def test_bad_registry_settings_are_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    from services.builder.settings import BuilderSettings
    from shared.errors import ConfigError
    from shared.settings import load

    monkeypatch.setenv("TORPOR_BUILDER_REGISTRY_PASSWORD", "hunter2-secret")
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load(BuilderSettings)
    message = str(caught.value)
    field = variable.removeprefix("TORPOR_BUILDER_").lower()
    assert "\n" not in message and f"configuration {field}:" in message
    assert "hunter2" not in message


def test_registry_settings_split_host_and_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    from services.builder.settings import BuilderSettings
    from shared.settings import load

    monkeypatch.setenv("TORPOR_BUILDER_REGISTRY", "127.0.0.1:5000/torpor/built")
    monkeypatch.setenv("TORPOR_BUILDER_REGISTRY_PASSWORD", "hunter2-secret")
    settings = load(BuilderSettings)
    assert (settings.registry_host(), settings.registry_prefix()) == (
        "127.0.0.1:5000",
        "torpor/built",
    )
    assert "hunter2" not in repr(settings)


def test_cache_keys_are_per_owner_and_per_base() -> None:
    """Two tenants sending the same steps never share a cached layer (a step's output is not a
    function of its text: `curl ... | sh` today is not tomorrow's, and one tenant must not
    plant what another's identical step would get)."""
    spec = BuildSpec(
        base="debian",
        steps=[
            Step(type="RUN", args=["echo hi"]),
            Step(type="ENV", args=["A", "1"]),
            Step(type="RUN", args=["echo there"]),
        ],
    )
    now = datetime.now(UTC)

    def keys(owner: str, base: str, build: str = "b1", force: bool = False) -> list[str]:
        record = BuildRecord(
            build_id=build, template_id="t" * 20, owner=owner, created_at=now, updated_at=now
        )
        parent = Parent("torpor/sandbox-base", base, Image((), {"rootfs": {"diff_ids": []}}))
        planned = plan(record, spec.model_copy(update={"force": force}), parent, State())
        return [p.key for p in planned]

    alice = keys("alice", "sha256:" + "a" * 64)
    assert alice == keys("alice", "sha256:" + "a" * 64, build="b2")  # a rebuild reuses
    assert not set(alice) & set(keys("bob", "sha256:" + "a" * 64))
    assert not set(alice) & set(keys("alice", "sha256:" + "b" * 64))
    assert not set(alice) & set(keys("alice", "sha256:" + "a" * 64, build="b2", force=True))
    # ENV changes what later steps run with: the step after it has its own key
    assert len(set(alice)) == 3
