"""An OCI registry for tests: go-containerregistry's ``crane registry serve`` (built by
``scripts/build-registry.sh``), plain HTTP on a loopback address, blobs on disk under the test's
folder (manifests in memory: the registry lives as long as its test session).

It listens on 127.0.0.1 only: containerd (in the host's network namespace) pulls from it, the
builder (a host process in the tests) pushes to it, and no pod can reach it at all: the rig's
pods sit behind a bridge whose host side answers only on the node's address.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.support.k8s.rig import REPO_ROOT, ClusterUnavailable, free_port, spawn, stop_process

BUILD_SCRIPT = REPO_ROOT / "scripts" / "build-registry.sh"
VERSION = "v0.22.1"


def registry_binary(*, build: bool) -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    binary = (
        Path(os.environ.get("TORPOR_REGISTRY_BIN", cache / "torpor" / "registry" / VERSION))
        / "crane"
    )
    if os.access(binary, os.X_OK):
        return binary
    if not build:
        raise ClusterUnavailable(f"{binary} not built: run scripts/build-registry.sh")
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT)], capture_output=True, text=True, timeout=1800, check=False
    )
    if done.returncode != 0:
        raise ClusterUnavailable(f"scripts/build-registry.sh failed: {done.stderr[-2000:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class RunningRegistry:
    host: str  # 127.0.0.1:<port>: image references start with it
    disk: Path

    @property
    def url(self) -> str:
        return f"http://{self.host}"


@contextmanager
def run_registry(
    binary: Path, workdir: Path, *, timeout: float = 60.0
) -> Iterator[RunningRegistry]:
    workdir.mkdir(parents=True, exist_ok=True)
    disk = workdir / "blobs"
    disk.mkdir(exist_ok=True)
    port = free_port()
    proc = spawn(
        [str(binary), "registry", "serve", "--address", f"127.0.0.1:{port}", "--disk", str(disk)],
        workdir / "registry.log",
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                tail = (workdir / "registry.log").read_text(errors="replace")[-2000:]
                raise ClusterUnavailable(f"the registry exited with {proc.returncode}:\n{tail}")
            with (
                suppress(OSError),
                urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/v2/", timeout=2
                ) as resp,  # loopback
            ):
                if resp.status == 200:
                    break
            if time.monotonic() > deadline:
                raise ClusterUnavailable("the registry did not answer in time")
            time.sleep(0.1)
        yield RunningRegistry(host=f"127.0.0.1:{port}", disk=disk)
    finally:
        stop_process(proc)


def push_archive(archive: Path, registry: str, repository: str, tag: str) -> str:
    """Copy an OCI archive (scripts/build-images.sh) into the registry; the manifest digest."""
    with tempfile.TemporaryDirectory() as scratch:
        digest_file = Path(scratch) / "digest"
        done = subprocess.run(
            [
                "skopeo",
                "copy",
                "--quiet",
                "--dest-tls-verify=false",
                f"--digestfile={digest_file}",
                f"oci-archive:{archive}",
                f"docker://{registry}/{repository}:{tag}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
        if done.returncode != 0:
            raise ClusterUnavailable(f"skopeo copy failed: {done.stderr.strip()[-1000:]}")
        return digest_file.read_text().strip()
