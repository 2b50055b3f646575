"""The registry adapter (shared/oci/registry.py) against a real OCI registry (go-containerregistry's,
as the real node's rig runs it), on loopback: blobs, manifests by tag and digest, tags, refusals."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from shared.oci.images import LAYER_TAR, Descriptor, Image, digest_of, parse_manifest, with_layer
from shared.oci.layers import file_blob
from shared.oci.registry import Registry, RegistryError
from tests.conftest import skip_or_fail
from tests.support.k8s.registry import RunningRegistry, registry_binary, run_registry
from tests.support.k8s.rig import ClusterUnavailable

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def oci_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningRegistry]:
    build = os.environ.get("CI", "").lower() == "true"
    try:
        binary = registry_binary(build=build)
    except ClusterUnavailable as e:
        skip_or_fail(str(e))
        return
    with run_registry(binary, tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture
async def registry(oci_registry: RunningRegistry) -> AsyncIterator[Registry]:
    client = Registry(oci_registry.host, insecure=True, timeout=30)
    yield client
    await client.close()


async def test_push_and_read_back_an_image(registry: Registry, tmp_path: Path) -> None:
    await registry.ping()
    layer_file = tmp_path / "layer.tar"
    layer_file.write_bytes(b"\0" * 10240)
    layer = file_blob(layer_file)
    assert not await registry.has_blob("t/app", layer.digest)
    await registry.push_blob("t/app", layer_file, layer.digest)
    assert await registry.has_blob("t/app", layer.digest)
    await registry.push_blob("t/app", layer_file, layer.digest)  # again: a no-op
    base = Image((), {"os": "linux", "rootfs": {"type": "layers", "diff_ids": []}})
    image = with_layer(base, layer, created_by="test")
    config_digest = await registry.push_bytes("t/app", image.config_bytes())
    assert config_digest == digest_of(image.config_bytes())
    digest = await registry.put_manifest("t/app", "v1", image.manifest_bytes())
    assert digest == image.digest()
    by_tag = await registry.get_manifest("t/app", "v1")
    by_digest = await registry.get_manifest("t/app", digest)
    assert by_tag is not None and by_digest is not None
    assert by_tag.digest == by_digest.digest == digest
    config, layers = parse_manifest(by_digest.data)
    assert layers == (Descriptor(LAYER_TAR, layer.digest, layer.size),)
    assert await registry.get_blob("t/app", config.digest) == image.config_bytes()
    assert "v1" in await registry.tags("t/app")
    # another repository gets the blob without the bytes passing through again
    await registry.copy_blob("t/other", layer.digest, source="t/app")
    assert await registry.has_blob("t/other", layer.digest)
    assert await registry.get_manifest("t/app", "missing") is None


async def test_a_blob_that_does_not_match_its_digest_is_refused(
    registry: Registry, tmp_path: Path
) -> None:
    path = tmp_path / "blob"
    path.write_bytes(b"what was built")
    with pytest.raises(RegistryError, match="refused"):
        await registry.push_blob("t/bad", path, digest_of(b"something else"))
    assert not await registry.has_blob("t/bad", digest_of(b"something else"))


@pytest.mark.parametrize("repo", ["../etc", "UPPER", "a//b", "--ro-bind", "a\x00b", ""])
async def test_hostile_repository_names_never_reach_the_wire(registry: Registry, repo: str) -> None:
    with pytest.raises(ValueError, match="repository"):
        await registry.tags(repo)


@pytest.mark.parametrize("ref", ["../../x", "sha256:abc", "-tag", "a" * 200, "t\x00"])
async def test_hostile_references_never_reach_the_wire(registry: Registry, ref: str) -> None:
    with pytest.raises(ValueError, match="tag or digest"):
        await registry.get_manifest("t/app", ref)
