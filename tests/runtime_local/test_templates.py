"""Template loading (pure logic, no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from shared.errors import ConfigError, NotFound
from shared.runtime.templates import (
    DEFAULT_TEMPLATE,
    load_template,
    parse_bytes,
    parse_millicpu,
    template_dirs,
)

pytestmark = pytest.mark.unit


def test_packaged_sandbox_base() -> None:
    template = load_template(DEFAULT_TEMPLATE, template_dirs(None))
    assert template.name == "sandbox-base"
    assert template.workdir == "/home/user"  # E2B's default cwd
    assert template.persist == "layer"  # files are kept across pauses
    assert template.command is None  # runs the in-sandbox daemon
    [volume] = template.volumes
    assert volume.mount_path == "/mnt/shared"
    assert volume.resolve(Path("/data"), sandbox_id="sb1", owner="alice") == Path(
        "/data/volumes/alice/sb1"
    )
    assert template.resources.limits.memory_bytes == 2 * 2**30


@pytest.mark.parametrize("value", ["keep", "", "None", "--ro-bind", 1])
def test_persist_takes_only_layer_or_none(tmp_path: Path, value: object) -> None:
    (tmp_path / "odd.yaml").write_text(yaml.safe_dump({"persist": value}))
    with pytest.raises(ConfigError, match="persist"):
        load_template("odd", template_dirs(tmp_path))
    (tmp_path / "fresh.yaml").write_text("persist: none\n")
    assert load_template("fresh", template_dirs(tmp_path)).persist == "none"


def test_operator_dir_is_searched_first(tmp_path: Path) -> None:
    (tmp_path / "sandbox-base.yaml").write_text("env: {A: b}\n")
    (tmp_path / "gpu.yaml").write_text("name: gpu\nworkdir: /work\n")
    assert load_template("sandbox-base", template_dirs(tmp_path)).env == {"A": "b"}
    assert load_template("gpu", template_dirs(tmp_path)).workdir == "/work"


def test_unknown_template_is_not_found_with_a_readable_message(tmp_path: Path) -> None:
    with pytest.raises(NotFound, match=r"template 'nope' not found \(searched "):
        load_template("nope", template_dirs(tmp_path))
    with pytest.raises(NotFound, match="invalid template name"):
        load_template("../etc/passwd", template_dirs(tmp_path))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("volumes: [{name: x}]\n", r"volumes\.0\.hostPath"),
        ("- a list\n", "must be a YAML mapping"),
        ("name: other\n", "is named 'other'"),
        ("env: {a: [unclosed\n", "not readable YAML"),
        ("colour: blue\n", "colour"),
    ],
)
def test_malformed_template_is_a_config_error(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "bad.yaml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_template("bad", template_dirs(tmp_path))


def test_quantities() -> None:
    assert parse_bytes("512Mi") == 512 * 2**20
    assert parse_bytes("1G") == 10**9
    assert parse_bytes("1024") == 1024
    assert parse_millicpu("500m") == 500
    assert parse_millicpu("1.5") == 1500
    with pytest.raises(ConfigError):
        parse_bytes("lots")
    with pytest.raises(ConfigError):
        parse_millicpu("fast")
