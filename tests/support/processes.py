"""Starting torpor's processes for a test, waiting for them, and stopping them so nothing is left:
each runs in its own session (a signal reaches its whole process group; the pods, which start
their own sessions, are not in it)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

import httpx

from tests.support.env import REPO, TORPOR


def spawn(
    args: list[str], *, env: dict[str, str], log: Path, command: list[str] = TORPOR
) -> subprocess.Popen[bytes]:
    """``torpor <args>`` (or ``command``) in its own session, its output appended to ``log``."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        return subprocess.Popen(
            [*command, *args],
            cwd=REPO,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def signal_group(proc: subprocess.Popen[bytes], sig: int) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)


def kill9(proc: subprocess.Popen[bytes]) -> bool:
    """SIGKILL the process group; True if the process was still alive."""
    if proc.poll() is not None:
        return False
    signal_group(proc, signal.SIGKILL)
    proc.wait()
    return True


def terminate(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM ``proc`` (the process alone, not its group); SIGKILL it if it is still there 10 s
    later. Nothing to do for one that has exited."""
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def stop(
    procs: Iterable[subprocess.Popen[bytes]],
    *,
    sig: int = signal.SIGTERM,
    grace: float = 15,
    group: bool = True,
) -> None:
    """Signal every process (``group``: its whole process group), give them ``grace`` seconds
    together, then SIGKILL the groups of the rest."""
    procs = list(procs)
    for proc in procs:
        if group:
            signal_group(proc, sig)
        elif proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(sig)
    deadline = time.monotonic() + grace
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        kill9(proc)


def _exited(proc: subprocess.Popen[bytes], name: str, log: Path | None) -> str:
    last = ""
    if log is not None and log.exists():
        last = (log.read_text(errors="replace").strip().splitlines()[-1:] or [""])[0][:300]
    return f"{name} exited with {proc.returncode} while starting: {last or '(no output)'}"


async def await_http(
    url: str,
    proc: subprocess.Popen[bytes],
    name: str,
    *,
    log: Path | None = None,
    timeout: float = 90,
) -> None:
    """Until ``url`` answers 200; fails at once if ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    async with httpx.AsyncClient(timeout=2, trust_env=False) as http:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(_exited(proc, name, log))
            with contextlib.suppress(httpx.HTTPError):
                if (await http.get(url)).status_code == 200:
                    return
            await asyncio.sleep(0.1)
    msg = f"{name} not ready at {url} within {timeout}s"
    raise RuntimeError(msg)
