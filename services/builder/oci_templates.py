"""The pod templates a Kubernetes build makes from ``sandbox-base``: its build pod's (the parent
image, the daemon as root with a package manager's capabilities, no volume) and the built
template's (the image, the build's env and commands, its volume seeded from the image)."""

from __future__ import annotations

from typing import Any

from services.builder.builds import DEFAULT_WORKDIR, Limits
from shared.models.template_records import Artifact, BuildRecord

# What apt, dpkg and useradd need as root; nothing that reaches beyond the container.
BUILD_CAPABILITIES = ["CHOWN", "DAC_OVERRIDE", "FOWNER", "FSETID", "SETUID", "SETGID", "KILL"]
SANDBOX_BASE = "sandbox-base"
DATA_VOLUME = "sandbox-data"
SEED_MARKER = ".torpor-seeded"


def build_pod_template(template: dict[str, Any], image: str, limits: Limits) -> dict[str, Any]:
    """``template`` (sandbox-base's) as the build pod's, on ``image``: its daemon as root with a
    package manager's capabilities, no volume (the steps' files stay in the container's layer)."""
    meta = template.setdefault("metadata", {})
    meta["annotations"] = {**(meta.get("annotations") or {}), "torpor.dev/persist": "none"}
    spec = template["spec"]
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v.get("name") != DATA_VOLUME]
    spec.pop("initContainers", None)
    spec["automountServiceAccountToken"] = False
    for container in spec["containers"]:
        container["image"] = image
        container["imagePullPolicy"] = "IfNotPresent"
        container["volumeMounts"] = [
            m for m in container.get("volumeMounts") or [] if m.get("name") != DATA_VOLUME
        ]
        container["workingDir"] = "/"
        container["env"] = [e for e in container.get("env") or [] if e.get("name") != "HOME"]
        container["env"].append({"name": "HOME", "value": "/root"})
        container["securityContext"] = {
            "runAsUser": 0,
            "runAsGroup": 0,
            "runAsNonRoot": False,
            "allowPrivilegeEscalation": False,
            "privileged": False,
            "capabilities": {"drop": ["ALL"], "add": list(BUILD_CAPABILITIES)},
            "seccompProfile": {"type": "RuntimeDefault"},
        }
        container["resources"] = {
            "requests": {"cpu": "100m", "memory": "128Mi"},
            "limits": {
                "cpu": limits.cpu,
                "memory": limits.memory,
                "ephemeral-storage": limits.disk,
            },
        }
    return template


def built_template(template: dict[str, Any], record: BuildRecord, artifact: Artifact) -> None:
    """``template`` (sandbox-base's) as the built template's, in place: the built image, the
    build's env and start/ready commands; its home and workspace volume seeded from the image."""
    assert artifact.image is not None
    spec = template["spec"]
    daemon = spec["containers"][0]
    daemon["image"] = artifact.image
    daemon["imagePullPolicy"] = "IfNotPresent"
    extra = dict(artifact.env)
    if artifact.start_cmd:
        extra["TORPOR_START_CMD"] = artifact.start_cmd
    if artifact.ready_cmd:
        extra["TORPOR_READY_CMD"] = artifact.ready_cmd
    if artifact.start_cmd or artifact.ready_cmd:
        extra["TORPOR_START_CWD"] = artifact.workdir or DEFAULT_WORKDIR
        extra["TORPOR_START_USER"] = "user"
    daemon["env"] = [e for e in daemon.get("env") or [] if e.get("name") not in extra]
    daemon["env"] += [{"name": k, "value": v} for k, v in extra.items()]
    limits = daemon.setdefault("resources", {}).setdefault("limits", {})
    limits["memory"] = f"{record.memory_mb}Mi"
    limits["cpu"] = str(record.cpu_count)
    seeds = seed_paths(daemon)
    if seeds:
        spec["initContainers"] = [seed_container(daemon, seeds)]


def seed_paths(daemon: dict[str, Any]) -> list[tuple[str, str]]:
    """(mount path, subPath) of the daemon's data-volume mounts."""
    return [
        (m["mountPath"], m.get("subPath", ""))
        for m in daemon.get("volumeMounts") or []
        if m.get("name") == DATA_VOLUME and m.get("mountPath")
    ]


def seed_container(daemon: dict[str, Any], seeds: list[tuple[str, str]]) -> dict[str, Any]:
    """Volumes hide what the image holds at their paths: copy the image's files there into the
    sandbox's volume once (a marker in the volume says it is done: a resume keeps the sandbox's
    own files)."""
    script = ["set -e", f"[ -e /seed/{SEED_MARKER} ] && exit 0"]
    for path, sub in seeds:
        target = f"/seed/{sub}" if sub else "/seed"
        script.append(f'mkdir -p "{target}"')
        script.append(f'if [ -d "{path}" ]; then cp -a "{path}/." "{target}/"; fi')
    script.append(f"touch /seed/{SEED_MARKER}")
    return {
        "name": "seed",
        "image": daemon["image"],
        "imagePullPolicy": daemon.get("imagePullPolicy", "IfNotPresent"),
        "command": ["/bin/sh", "-c", "\n".join(script)],
        "securityContext": dict(daemon.get("securityContext") or {}),
        "resources": dict(daemon.get("resources") or {}),
        "volumeMounts": [{"name": DATA_VOLUME, "mountPath": "/seed"}],
    }
