"""The images built here (scripts/build-images.sh), started by testcontainers through podman.

control-plane: the ``torpor`` entry point, user 10001, no embedded nats-server, only the package
(no tests, no benchmarks). nats: JetStream from the image. sandbox-base: the daemon answers and
runs a command as user 1000 with the sandbox userland. Containers use the host network with
127.0.0.1 listeners on free ports (or no network at all), so nothing leaves loopback.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Iterator

import pytest
from testcontainers.core.config import testcontainers_config
from testcontainers.core.container import DockerContainer

from tests.images.podman import Podman
from tests.support.k8s.rig import free_port

# 1200 s: the first test also pays for a rebuild of the images when their inputs changed
pytestmark = [pytest.mark.realnode, pytest.mark.timeout(1200)]


@pytest.fixture(autouse=True)
def _no_ryuk(podman: Podman) -> Iterator[None]:
    before = testcontainers_config.ryuk_disabled
    testcontainers_config.ryuk_disabled = True  # Ryuk's image is on Docker Hub: unreachable
    yield
    testcontainers_config.ryuk_disabled = before


def wait_exit(container: DockerContainer, timeout: float = 120) -> int:
    return int(container.get_wrapped_container().wait(timeout=timeout)["StatusCode"])


def test_control_plane_image_runs_torpor_as_non_root_without_extras(podman: Podman) -> None:
    image = podman.images["control-plane"]
    with (
        DockerContainer(image).with_command(["--help"]).with_kwargs(network_mode="none") as help_run
    ):
        assert wait_exit(help_run) == 0
        out = b"".join(help_run.get_logs()).decode()
        assert "run" in out
        attrs = help_run.get_wrapped_container().attrs
        assert attrs["Config"]["User"] == "10001:10001"
    check = (
        "import importlib.util as u, os, pathlib, sys\n"
        "assert os.getuid() == 10001, os.getuid()\n"
        "assert not pathlib.Path('/opt/torpor/bin/nats-server').exists()\n"
        "assert u.find_spec('tests') is None and u.find_spec('bench') is None\n"
        "import services.api, services.proxy, services.scheduler, shared.runtime.kubernetes\n"
        "print('ok')\n"
    )
    with DockerContainer(image).with_kwargs(
        network_mode="none", entrypoint=["/opt/torpor/bin/python", "-c", check]
    ) as probe:
        code = wait_exit(probe)
        out = b"".join(probe.get_logs()).decode()
        assert code == 0, out
        assert out.strip().endswith("ok")


async def test_nats_image_serves_jetstream(podman: Podman) -> None:
    import nats

    port = free_port()
    container = (
        DockerContainer(podman.images["nats"])
        .with_command(["-js", "-a", "127.0.0.1", "-p", str(port), "-sd", "/data"])
        .with_kwargs(network_mode="host")
        .with_tmpfs_mount("/data")
    )
    with container:
        nc = None
        deadline = time.monotonic() + 60
        while nc is None:
            try:
                nc = await nats.connect(f"nats://127.0.0.1:{port}", connect_timeout=1)
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.3)
        # by name, as the StatefulSet's preStop runs it (nats-server --signal ldm=...)
        code, version = container.exec(["nats-server", "--version"])
        assert code == 0, version
        assert b"v2.15.1" in version, version
        try:
            js = nc.jetstream()
            await js.add_stream(name="IMAGES", subjects=["images.>"])
            ack = await js.publish("images.test", b"hello")
            assert ack.stream == "IMAGES"
            msg = await js.get_msg("IMAGES", ack.seq)
            assert msg.data == b"hello"
        finally:
            await nc.close()


def test_sandbox_base_image_serves_the_daemon_as_user_1000(podman: Podman) -> None:
    port = free_port()
    container = (
        DockerContainer(podman.images["sandbox-base"])
        .with_command(["--listen", f"127.0.0.1:{port}", "--root", "/workspace"])
        .with_kwargs(network_mode="host")
    )
    with container:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    assert r.status in (200, 204)
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
    # the userland, checked in a second container (podman 4.3 leaves an exec session's conmon
    # behind after the compat API's exec, so no exec here)
    probe = DockerContainer(podman.images["sandbox-base"]).with_kwargs(
        network_mode="none",
        entrypoint=[
            "/bin/sh",
            "-c",
            "id -u; for t in bash git curl tini sudo; do command -v $t; done",
        ],
    )
    with probe:
        assert wait_exit(probe) == 0
        lines = b"".join(probe.get_logs()).decode().split()
    assert lines[0] == "1000"
    assert len(lines) == 6, lines
