"""The local runtime's template files the builder writes (``<data dir>/<BUILT_TEMPLATES_DIR>``):
a build pod's template, and a ready build's, named by its build id."""

from __future__ import annotations

import secrets
from pathlib import Path

import yaml

from services.builder.builds import DEFAULT_WORKDIR, Limits, State
from shared.models.template_records import BUILT_TEMPLATES_DIR, Artifact, BuildRecord


def write_build_template(
    data_dir: Path, name: str, layers: list[str], state: State, limits: Limits
) -> None:
    """A RUN step's build pod: the layers so far and the settings of the steps before it."""
    write_yaml(
        data_dir,
        name,
        {
            "name": name,
            "workdir": "/",
            "env": {"LANG": "C.UTF-8", "PIP_BREAK_SYSTEM_PACKAGES": "1", **state.env},
            "layers": layers,
            "resources": {
                "limits": {
                    "memory": limits.memory,
                    "cpu": limits.cpu,
                    "pids": 4096,
                    "nofile": 65536,
                    "disk": limits.disk,
                }
            },
        },
    )


def write_template(data_dir: Path, record: BuildRecord, artifact: Artifact) -> None:
    """The ready build as a template of the local runtime, named by its build id: the
    packaged sandbox template plus the layers, env, user and commands of the build."""
    from shared.runtime.templates import PACKAGED_TEMPLATES_DIR

    base = yaml.safe_load((PACKAGED_TEMPLATES_DIR / "sandbox-base.yaml").read_text())
    base["name"] = record.build_id
    base["env"] = {**base.get("env", {}), **artifact.env}
    base["layers"] = artifact.layers
    base["user"] = artifact.user
    limits = base.setdefault("resources", {}).setdefault("limits", {})
    limits["memory"] = f"{record.memory_mb}Mi"
    limits["cpu"] = str(record.cpu_count)
    for field_name in ("start_cmd", "ready_cmd"):
        value = getattr(artifact, field_name)
        if value:
            base[field_name] = value
    if artifact.start_cmd or artifact.ready_cmd:
        base["start_cwd"] = artifact.workdir or DEFAULT_WORKDIR
    write_yaml(data_dir, record.build_id, base)


def write_yaml(data_dir: Path, name: str, content: dict[str, object]) -> None:
    folder = data_dir / BUILT_TEMPLATES_DIR
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    partial = folder / f".{name}.{secrets.token_hex(4)}.partial"
    partial.write_text(yaml.safe_dump(content, sort_keys=False))
    partial.replace(folder / f"{name}.yaml")
