"""Fixture ``podman``: podman's Docker API socket with the built images, for testcontainers."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import ON_CI, skip_or_fail
from tests.images.podman import Podman, PodmanUnavailable, podman_service


@pytest.fixture(scope="session")
def podman() -> Iterator[Podman]:
    try:
        provider = podman_service(on_ci=ON_CI)
        service = provider.__enter__()
    except PodmanUnavailable as e:
        skip_or_fail(f"no podman with the built images: {e}")
        return
    patch = pytest.MonkeyPatch()
    # testcontainers and docker-py read these; Ryuk's image is on Docker Hub (unreachable)
    patch.setenv("DOCKER_HOST", service.docker_host)
    patch.setenv("TESTCONTAINERS_RYUK_DISABLED", "true")
    try:
        yield service
    finally:
        patch.undo()
        provider.__exit__(None, None, None)
