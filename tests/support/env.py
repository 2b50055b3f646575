"""The environment a torpor process of a test starts with, and running the ``torpor`` command."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TORPOR = [sys.executable, "-m", "services.cli"]
# What points a process at another instance (a developer's shell may have these set).
FOREIGN = ("TORPOR_", "E2B_", "NATS_", "PAUSE_RESUME")
# The CLI's output as the tests read it: unbuffered, wide, plain.
CLI = {"PYTHONUNBUFFERED": "1", "COLUMNS": "200", "NO_COLOR": "1"}


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment minus anything that points torpor at another instance."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(FOREIGN)}
    env.update(extra)
    return env


def cli_env(**extra: str) -> dict[str, str]:
    """``clean_env`` for the ``torpor`` command whose output a test reads."""
    return clean_env(**CLI, **extra)


def parse_exports(text: str) -> dict[str, str]:
    """The variables of ``torpor env``'s output (``export NAME=value`` lines, shell-quoted)."""
    out = {}
    for line in text.splitlines():
        assert line.startswith("export "), line
        key, _, value = line.removeprefix("export ").partition("=")
        out[key] = shlex.split(value)[0]
    return out


def torpor(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """``torpor <args>`` to completion (never raises on its exit code)."""
    return subprocess.run(
        [*TORPOR, *args],
        capture_output=True,
        text=True,
        env=env if env is not None else clean_env(),
        cwd=REPO,
        timeout=timeout,
        check=False,
    )
