"""podman's Docker-compatible API for testcontainers, serving the images built here.

No Docker engine runs on the test machines; ``podman system service`` serves the same API on a
unix socket. Each test session gets its own socket; the store is the one ``scripts/build-images.sh``
builds into (``~/.cache/torpor/images/store``, never the machine's /var/lib/containers), so the
images are there without loading anything. ``DOCKER_HOST`` points at the socket. Ryuk
(testcontainers' reaper) is an image from Docker Hub, which is not reachable: it is disabled and
the fixture removes this session's containers (by testcontainers' session label) itself.

Root here lacks CAP_SYS_RESOURCE, so podman's default ``nofile`` limit (1048576, above the hard
limit) makes runc fail with "error setting rlimit type 7: operation not permitted" (type 6,
``nproc``, likewise): the service's containers.conf caps nofile at the current hard limit and
nproc at 4096.

For users with podman:  ``systemctl --user start podman.socket`` (or
``podman system service --time=0 unix:///run/user/$UID/podman/podman.sock &``), then
``export DOCKER_HOST=unix:///run/user/$UID/podman/podman.sock TESTCONTAINERS_RYUK_DISABLED=true``.
"""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.k8s.realnode import ensure_images, images_folder
from tests.support.k8s.rig import ClusterUnavailable, stop_process


class PodmanUnavailable(Exception):
    """podman or the built images are missing; the message says which."""


@dataclass(frozen=True)
class Podman:
    docker_host: str  # unix://<socket>, what DOCKER_HOST takes
    images: dict[str, str]  # short name -> image reference loaded into this podman
    base_argv: tuple[str, ...]  # `podman --root ... --runroot ...` of this store


def _podman_argv(store: Path, folder: Path) -> list[str]:
    return [
        "podman",
        "--root",
        str(store / "store"),
        "--runroot",
        str(store / "run"),
        "--storage-driver",
        "overlay",
        "--cgroup-manager",
        "cgroupfs",
        "--events-backend",
        "file",
        "--tmpdir",
        str(folder / "tmp"),
    ]


@contextlib.contextmanager
def podman_service(*, on_ci: bool) -> Iterator[Podman]:
    if shutil.which("podman") is None:
        raise PodmanUnavailable("podman is not installed (scripts/setup.sh installs it)")
    if os.geteuid() != 0:
        raise PodmanUnavailable("the test podman runs rootful (its own store under /tmp)")
    build = on_ci or (images_folder() / "images.txt").exists()
    try:
        built = ensure_images(build=build)
    except ClusterUnavailable as e:
        raise PodmanUnavailable(str(e)) from e
    folder = Path(tempfile.mkdtemp(prefix="torpor-pm-"))
    base = _podman_argv(images_folder(), folder)
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    # nproc at the hard limit still failed here (runc runs under conmon's lower limit): a
    # smaller fixed cap is plenty for a test container
    procs = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], 4096)
    conf = folder / "containers.conf"
    conf.write_text(
        f'[containers]\ndefault_ulimits = ["nofile={files}:{files}", "nproc={procs}:{procs}"]\n'
    )
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    proc = None
    try:
        (folder / "tmp").mkdir()
        sock = folder / "podman.sock"
        with (folder / "service.log").open("ab") as log:
            proc = subprocess.Popen(
                [*base, "system", "service", "--time=0", f"unix://{sock}"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        deadline = time.monotonic() + 30
        while not sock.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (folder / "service.log").read_text(errors="replace")[-2000:]
                raise PodmanUnavailable(f"podman system service did not start:\n{tail}")
            time.sleep(0.1)
        yield Podman(
            docker_host=f"unix://{sock}",
            images={short: ref for short, (ref, _) in built.items()},
            base_argv=tuple(base),
        )
    finally:
        if proc is not None:
            from testcontainers.core.labels import LABEL_SESSION_ID, SESSION_ID

            listed = subprocess.run(
                [*base, "ps", "-aq", "--filter", f"label={LABEL_SESSION_ID}={SESSION_ID}"],
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
                env=env,
            )
            if ids := listed.stdout.split():
                subprocess.run(
                    [*base, "rm", "--force", "--time", "0", *ids],
                    capture_output=True,
                    check=False,
                    timeout=120,
                    env=env,
                )
            stop_process(proc)
        shutil.rmtree(folder, ignore_errors=True)
