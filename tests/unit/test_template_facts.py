"""``read_facts``: a template's lifecycle section (hooks, activity policy), its persist mode and
version, read the way each runtime reads templates (local YAML; a Kubernetes PodTemplate with the
``torpor.dev/lifecycle`` annotation)."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from shared.runtime.template_facts import ANNOTATION_LIFECYCLE, read_facts

LIFECYCLE = {
    "hooks": {"prePause": {"command": "sync", "timeout": 5, "onFailure": "abort"}},
    "activity": {"signals": ["cpu", "keepalive"], "maxLifetime": 600, "expiringNotice": 30},
}


def test_local_template_lifecycle_persist_and_version(tmp_path: Path) -> None:
    (tmp_path / "hooked.yaml").write_text(
        yaml.safe_dump({"name": "hooked", "persist": "none", "lifecycle": LIFECYCLE})
    )
    facts = read_facts("local", tmp_path, "hooked")
    assert facts.keeps_files is False and facts.version and facts.version.startswith("sha256:")
    assert facts.hooks.pre_pause is not None and facts.hooks.pre_pause.on_failure == "abort"
    assert facts.activity.signals == ("cpu", "keepalive") and facts.activity.expiring_notice == 30
    version = facts.version
    (tmp_path / "hooked.yaml").write_text(yaml.safe_dump({"name": "hooked", "persist": "none"}))
    changed = read_facts("local", tmp_path, "hooked")
    assert changed.version != version and not changed.hooks and not changed.activity.signals


def test_a_broken_or_missing_template_is_unknown_not_an_error(tmp_path: Path) -> None:
    bad = {"name": "bad", "lifecycle": {"hooks": {"prePause": {"command": "x\x00y"}}}}
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(bad))
    for name in ("bad", "missing", "../etc/passwd"):
        facts = read_facts("local", tmp_path, name)
        assert facts.version is None and not facts.hooks and facts.keeps_files


def test_kubernetes_pod_template_annotation(tmp_path: Path) -> None:
    def pod_template(annotations: dict[str, str]) -> str:
        return yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": "k"},
                "template": {
                    "metadata": {"annotations": annotations},
                    "spec": {"containers": [{"name": "sandbox", "image": "x"}]},
                },
            }
        )

    (tmp_path / "k.yaml").write_text(
        pod_template({ANNOTATION_LIFECYCLE: json.dumps(LIFECYCLE), "torpor.dev/persist": "none"})
    )
    facts = read_facts("kubernetes", tmp_path, "k")
    assert facts.hooks.pre_pause is not None and facts.activity.max_lifetime == 600
    assert facts.keeps_files is False
    (tmp_path / "k.yaml").write_text(pod_template({ANNOTATION_LIFECYCLE: '{"activity": 1}'}))
    assert not read_facts("kubernetes", tmp_path, "k").hooks  # invalid: logged, ignored
