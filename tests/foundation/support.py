"""Helpers for tests that run the ``torpor`` command as a real process."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TORPOR = [sys.executable, "-m", "services.cli"]


def clean_env(**extra: str) -> dict[str, str]:
    """The environment minus anything that points torpor at another instance."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORPOR_", "E2B_", "NATS_"))}
    env.update(extra)
    return env


def torpor(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*TORPOR, *args],
        capture_output=True,
        text=True,
        env=env or clean_env(),
        timeout=60,
        check=False,
    )


def processes_mentioning(needle: str) -> list[int]:
    """Pids whose command line or environment contains ``needle`` (a /proc scan, no psutil)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            blob = (entry / "cmdline").read_bytes() + b"\0" + (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[-1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle.encode() in blob:
            found.append(int(entry.name))
    return found


def pid_of_service(name: str, data_dir: Path) -> int | None:
    for pid in processes_mentioning(f"TORPOR_DATA_DIR={data_dir}"):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[-3:-1] == [b"run", name.encode()] or cmdline[-2:] == [b"run", name.encode()]:
            return pid
    return None
