"""OCI image manifests and configs (image-spec v1): a template's image is its base image's
layers plus one layer per built step, its config the base's with the build's env, workdir and
torpor's labels (start and ready command)."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from shared.oci.layers import Blob

MANIFEST = "application/vnd.oci.image.manifest.v1+json"
CONFIG = "application/vnd.oci.image.config.v1+json"
LAYER_TAR = "application/vnd.oci.image.layer.v1.tar"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
ACCEPTED_MANIFESTS = (MANIFEST, DOCKER_MANIFEST)
LAYER_TYPES = frozenset(
    {
        LAYER_TAR,
        "application/vnd.oci.image.layer.v1.tar+gzip",
        "application/vnd.oci.image.layer.v1.tar+zstd",
        "application/vnd.docker.image.rootfs.diff.tar.gzip",
    }
)
LABEL_START = "dev.torpor.start-cmd"
LABEL_READY = "dev.torpor.ready-cmd"
LABEL_BUILD = "dev.torpor.build"
_DIGEST_RE = re.compile(r"^sha256:[a-f0-9]{64}$")
MAX_LAYERS = 120  # overlayfs stacks about 128 lowers; leave room


class BadImage(ValueError):
    """A manifest or config that is not an image torpor builds on."""


def is_digest(value: str) -> bool:
    return bool(_DIGEST_RE.match(value))


def digest_of(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def canonical(document: Mapping[str, Any]) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int

    def wire(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}

    @classmethod
    def parse(cls, item: object) -> Descriptor:
        if not isinstance(item, dict):
            raise BadImage("a descriptor is not an object")
        media, digest, size = item.get("mediaType"), item.get("digest"), item.get("size")
        if not isinstance(media, str) or not isinstance(digest, str) or not is_digest(digest):
            raise BadImage(f"bad descriptor {str(item)[:120]}")
        if not isinstance(size, int) or size < 0:
            raise BadImage(f"bad descriptor size {str(item)[:120]}")
        return cls(media, digest, size)


@dataclass(frozen=True)
class Image:
    """An image as the builder handles it: layers (lowest first) and the config document."""

    layers: tuple[Descriptor, ...]
    config: dict[str, Any]

    def config_bytes(self) -> bytes:
        return canonical(self.config)

    def manifest(self) -> dict[str, Any]:
        data = self.config_bytes()
        return {
            "schemaVersion": 2,
            "mediaType": MANIFEST,
            "config": Descriptor(CONFIG, digest_of(data), len(data)).wire(),
            "layers": [layer.wire() for layer in self.layers],
        }

    def manifest_bytes(self) -> bytes:
        return canonical(self.manifest())

    def digest(self) -> str:
        return digest_of(self.manifest_bytes())


def parse_manifest(data: bytes) -> tuple[Descriptor, tuple[Descriptor, ...]]:
    """The config and layer descriptors of a single-platform image manifest."""
    try:
        document = json.loads(data)
    except ValueError as e:
        raise BadImage(f"manifest is not JSON: {e}") from e
    if not isinstance(document, dict) or document.get("schemaVersion") != 2:
        raise BadImage("not a schema 2 image manifest")
    if document.get("mediaType", MANIFEST) not in ACCEPTED_MANIFESTS:
        raise BadImage(f"unsupported manifest type {document.get('mediaType')!r}")
    config = Descriptor.parse(document.get("config"))
    layers = document.get("layers")
    if not isinstance(layers, list) or len(layers) > MAX_LAYERS:
        raise BadImage("bad layer list")
    parsed = tuple(Descriptor.parse(item) for item in layers)
    for layer in parsed:
        if layer.media_type not in LAYER_TYPES:
            raise BadImage(f"unsupported layer type {layer.media_type!r}")
    return config, parsed


def parse_config(data: bytes) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except ValueError as e:
        raise BadImage(f"image config is not JSON: {e}") from e
    if not isinstance(document, dict) or not isinstance(document.get("rootfs"), dict):
        raise BadImage("not an image config")
    diff_ids = document["rootfs"].get("diff_ids")
    if not isinstance(diff_ids, list) or not all(isinstance(d, str) for d in diff_ids):
        raise BadImage("image config without diff ids")
    return document


def with_layer(image: Image, layer: Blob, *, created_by: str) -> Image:
    """``image`` plus one uncompressed layer on top (its digest is its diff id)."""
    if len(image.layers) >= MAX_LAYERS:
        raise BadImage(f"more than {MAX_LAYERS} layers")
    config = json.loads(json.dumps(image.config))
    config["rootfs"]["diff_ids"].append(layer.digest)
    config.setdefault("history", []).append(
        {"created": _now(), "created_by": created_by[:500], "comment": "torpor builder"}
    )
    return Image((*image.layers, Descriptor(LAYER_TAR, layer.digest, layer.size)), config)


def with_settings(
    image: Image,
    *,
    env: Mapping[str, str],
    workdir: str,
    labels: Mapping[str, str],
) -> Image:
    """``image`` with the build's env (added to the base's), working folder and labels."""
    config = json.loads(json.dumps(image.config))
    inner = config.setdefault("config", {})
    merged = dict(_split_env(inner.get("Env") or []))
    merged.update(env)
    inner["Env"] = [f"{k}={v}" for k, v in merged.items()]
    inner["WorkingDir"] = workdir
    inner["Labels"] = {**(inner.get("Labels") or {}), **labels}
    config["created"] = _now()
    return Image(image.layers, config)


def _split_env(items: Sequence[str]) -> list[tuple[str, str]]:
    out = []
    for item in items:
        key, sep, value = str(item).partition("=")
        if sep:
            out.append((key, value))
    return out


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
