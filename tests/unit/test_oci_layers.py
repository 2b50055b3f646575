"""Layer archives and image documents (shared/oci/layers.py, images.py): hostile tars from a
build pod are refused or cleaned, whiteouts are exactly OCI's, manifests and configs add up."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest

from shared.oci.images import (
    LAYER_TAR,
    BadImage,
    Descriptor,
    Image,
    digest_of,
    parse_config,
    parse_manifest,
    with_layer,
    with_settings,
)
from shared.oci.layers import (
    BadLayer,
    check_name,
    file_blob,
    repack,
    whiteout_name,
    whiteout_target,
)
from tests.support.tar_members import member, write_tar


def _members(path: Path) -> dict[str, tarfile.TarInfo]:
    with tarfile.open(path) as tar:
        return {m.name: m for m in tar}


def test_repack_keeps_a_clean_layer_and_hashes_it(tmp_path: Path) -> None:
    source = write_tar(
        tmp_path / "in.tar",
        [
            (member("etc", tarfile.DIRTYPE, mode=0o755), None),
            (member("etc/app.conf", uid=1000, gid=1000, uname="user", gname="user"), b"x=1\n"),
            (member("usr/bin/tool", mode=0o4755), b"#!/bin/sh\n"),
            (member("etc/link", tarfile.SYMTYPE, linkname="/etc/app.conf"), None),
            (member("etc/hard", tarfile.LNKTYPE, linkname="etc/app.conf"), None),
            (member("var/.wh.cache"), b""),
            (member("opt/.wh..wh..opq"), b""),
            (member("./run/./fifo", tarfile.FIFOTYPE), None),
        ],
    )
    blob = repack(source, tmp_path / "out.tar")
    assert blob == file_blob(tmp_path / "out.tar")
    members = _members(tmp_path / "out.tar")
    assert set(members) == {
        "etc",
        "etc/app.conf",
        "usr/bin/tool",
        "etc/link",
        "etc/hard",
        "var/.wh.cache",
        "opt/.wh..wh..opq",
        "run/fifo",
    }
    conf = members["etc/app.conf"]
    assert (conf.uid, conf.gid, conf.uname, conf.gname) == (1000, 1000, "", "")
    assert members["usr/bin/tool"].mode == 0o755  # setuid dropped
    assert members["etc/link"].linkname == "/etc/app.conf"
    assert members["etc/hard"].islnk()
    with tarfile.open(tmp_path / "out.tar") as tar:
        handle = tar.extractfile("etc/app.conf")
        assert handle is not None
        assert handle.read() == b"x=1\n"


@pytest.mark.parametrize(
    ("name", "kind", "extra"),
    [
        ("../etc/passwd", tarfile.REGTYPE, {}),
        ("a/../../b", tarfile.REGTYPE, {}),
        ("/etc/passwd", tarfile.REGTYPE, {}),
        ("a/b\x01c", tarfile.REGTYPE, {}),
        ("a\nb", tarfile.REGTYPE, {}),
        (".", tarfile.DIRTYPE, {}),
        ("x" * 5000, tarfile.REGTYPE, {}),
        ("dev/sda", tarfile.BLKTYPE, {}),
        ("dev/mem", tarfile.CHRTYPE, {}),
        ("a/.wh.", tarfile.REGTYPE, {}),
        ("a/.wh...", tarfile.REGTYPE, {}),
        ("a/.wh..wh.x", tarfile.REGTYPE, {}),
        ("a/.wh..wh..opq/x", tarfile.REGTYPE, {}),
        (".wh.etc/passwd", tarfile.REGTYPE, {}),
        ("a/.wh.b", tarfile.DIRTYPE, {}),
        ("a/.wh.b", tarfile.SYMTYPE, {"linkname": "/"}),
        ("hard", tarfile.LNKTYPE, {"linkname": "/etc/shadow"}),
        ("hard", tarfile.LNKTYPE, {"linkname": "../../etc/shadow"}),
        ("hard", tarfile.LNKTYPE, {"linkname": "not/in/layer"}),
        ("--ro-bind", tarfile.REGTYPE, {"uid": -1}),
    ],
)
def test_repack_refuses_hostile_members(
    tmp_path: Path, name: str, kind: bytes, extra: dict[str, object]
) -> None:
    data = b"" if kind == tarfile.REGTYPE else None
    source = write_tar(tmp_path / "in.tar", [(member(name, kind, **extra), data)])
    with pytest.raises(BadLayer):
        repack(source, tmp_path / "out.tar")


def test_a_non_empty_whiteout_is_refused(tmp_path: Path) -> None:
    source = write_tar(tmp_path / "in.tar", [(member("a/.wh.b"), b"payload")])
    with pytest.raises(BadLayer, match="whiteout"):
        repack(source, tmp_path / "out.tar")


def test_repack_bounds_members_and_bytes(tmp_path: Path) -> None:
    source = write_tar(tmp_path / "in.tar", [(member(f"f{i}"), b"abc") for i in range(5)])
    with pytest.raises(BadLayer, match="members"):
        repack(source, tmp_path / "o1.tar", max_members=4)
    big = write_tar(tmp_path / "big.tar", [(member("big"), b"\0" * 200_000)])
    with pytest.raises(BadLayer, match="larger"):
        repack(big, tmp_path / "o2.tar", max_bytes=100_000)


def test_not_a_tar_is_refused(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"\x00garbage" * 100)
    with pytest.raises(BadLayer):
        repack(tmp_path / "junk", tmp_path / "out.tar")


def test_whiteout_names() -> None:
    assert whiteout_name("etc/old.conf") == "etc/.wh.old.conf"
    assert whiteout_name("top") == ".wh.top"
    assert whiteout_target("etc/.wh.old.conf") == "etc/old.conf"
    assert whiteout_target("etc/.wh..wh..opq") == "etc/"
    assert whiteout_target("etc/plain") is None
    assert check_name("./a//b/") == "a/b"
    for bad in ("../x", "/abs", "a/\x00b", "a/.wh.b/c"):
        with pytest.raises(BadLayer):
            check_name(bad)
    with pytest.raises(BadLayer):
        whiteout_name("etc/.wh.x")


def _base() -> Image:
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {"Env": ["PATH=/usr/bin", "LANG=C"], "User": "1000"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + "1" * 64]},
    }
    return Image((Descriptor(LAYER_TAR, "sha256:" + "1" * 64, 10),), config)


def test_an_image_grows_by_layers_and_settings() -> None:
    from shared.oci.layers import Blob

    layer = Blob("sha256:" + "2" * 64, 20)
    image = with_settings(
        with_layer(_base(), layer, created_by="RUN echo hi"),
        env={"LANG": "C.UTF-8", "APP": "1"},
        workdir="/home/user",
        labels={"dev.torpor.start-cmd": "sleep 1"},
    )
    manifest = json.loads(image.manifest_bytes())
    assert [item["digest"] for item in manifest["layers"]] == ["sha256:" + "1" * 64, layer.digest]
    assert manifest["config"]["digest"] == digest_of(image.config_bytes())
    assert image.digest() == digest_of(image.manifest_bytes())
    config, layers = parse_manifest(image.manifest_bytes())
    assert config.size == len(image.config_bytes())
    assert len(layers) == 2
    parsed = parse_config(image.config_bytes())
    assert parsed["rootfs"]["diff_ids"][-1] == layer.digest
    assert parsed["config"]["Env"] == ["PATH=/usr/bin", "LANG=C.UTF-8", "APP=1"]
    assert parsed["config"]["WorkingDir"] == "/home/user"
    assert parsed["config"]["User"] == "1000"
    assert _base().config["rootfs"]["diff_ids"] == ["sha256:" + "1" * 64]  # not mutated


@pytest.mark.parametrize(
    "document",
    [
        b"not json",
        b"[]",
        json.dumps({"schemaVersion": 1}).encode(),
        json.dumps(
            {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json"}
        ).encode(),
        json.dumps(
            {
                "schemaVersion": 2,
                "config": {"mediaType": "x", "digest": "sha256:../../etc", "size": 1},
                "layers": [],
            }
        ).encode(),
        json.dumps(
            {
                "schemaVersion": 2,
                "config": {"mediaType": "x", "digest": "sha256:" + "a" * 64, "size": 1},
                "layers": [{"mediaType": "text/evil", "digest": "sha256:" + "b" * 64, "size": 1}],
            }
        ).encode(),
    ],
)
def test_bad_manifests_are_refused(document: bytes) -> None:
    with pytest.raises(BadImage):
        parse_manifest(document)
