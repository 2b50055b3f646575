"""A Kubernetes build's pod: the daemon's commands as root (the snapshot and diff of
``pod_diff``, unpacking a COPY) and its files in and out, each failure a failed step."""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from services.builder.builds import Commands, StepFailed
from shared.errors import EnvdError, EnvdUnavailable
from shared.models.snapshots import ProcessConfig
from shared.ports.workloads import Endpoint

BUILD_DIR = "/run/torpor-build"
STATE_FILE = f"{BUILD_DIR}/state.json"
LAYER_FILE = f"{BUILD_DIR}/layer.tar"
COPY_FILE = f"{BUILD_DIR}/copy.tar"
PYTHON = "/usr/bin/python3"
OWN_USER_FOLDERS = (
    'for d in /home/user /workspace; do if [ -d "$d" ] && [ "$(stat -c %u "$d")" != 1000 ]; '
    'then chown 1000:1000 "$d"; fi; done'
)


class PodFiles(Commands, Protocol):
    async def upload_file(
        self, endpoint: Endpoint, path: str, source: Path, *, user: str, access_token: str | None
    ) -> None: ...
    async def download_file(
        self,
        endpoint: Endpoint,
        path: str,
        dest: Path,
        *,
        user: str,
        access_token: str | None,
        max_bytes: int,
    ) -> int: ...


class BuildPod:
    """The build pod's daemon, as root."""

    def __init__(self, files: PodFiles, endpoint: Endpoint, token: str) -> None:
        self.files = files
        self.endpoint = endpoint
        self.token = token

    async def root(self, number: int, argv: list[str], timeout: float = 600.0) -> None:
        tail: list[str] = []

        async def keep(line: str) -> None:
            tail.append(line)
            del tail[:-20]

        try:
            code = await self.files.run(
                self.endpoint,
                ProcessConfig(cmd=argv[0], args=argv[1:], cwd="/"),
                user="root",
                access_token=self.token,
                on_output=keep,
                timeout=timeout,
            )
        except (EnvdError, EnvdUnavailable) as e:
            raise StepFailed(number, f"the build pod failed: {e}") from e
        if code != 0:
            what = "snapshot of the files" if argv[0] == PYTHON else argv[0]
            shown = " | ".join(tail)[-500:]
            raise StepFailed(number, f"the build pod's {what} failed ({code}): {shown}")

    async def upload(self, number: int, source: Path, path: str) -> None:
        try:
            await self.files.upload_file(
                self.endpoint, path, source, user="root", access_token=self.token
            )
        except (EnvdError, EnvdUnavailable) as e:
            raise StepFailed(number, f"cannot hand the files to the build pod: {e}") from e

    async def download(self, number: int, path: str, dest: Path, limit: int) -> None:
        try:
            await self.files.download_file(
                self.endpoint, path, dest, user="root", access_token=self.token, max_bytes=limit
            )
        except (EnvdError, EnvdUnavailable) as e:
            raise StepFailed(number, f"cannot read the step's files: {e}") from e
