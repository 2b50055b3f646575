"""The daemon's bytecode cache: compiled once by the runtime, read-only inside pods.

Pods see the code read-only, so a daemon without fresh bytecode compiles its imports on every
start (a few hundred ms to seconds). The runtime never writes into the source tree: bytecode
goes to a ``pycache_prefix`` directory in the venv (shared by every runtime of that interpreter,
so a fresh data dir costs nothing), or under the data dir when the venv is read-only. The daemon
is started with ``-X pycache_prefix=<dir>``, which (unlike ``PYTHONPYCACHEPREFIX``) is not
inherited by the processes it runs for the sandbox.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from pathlib import Path

import structlog

log = structlog.get_logger()

_SENTINELS = ("uvicorn", "connectrpc", "protobuf")  # big third-party imports
_precompiled: set[tuple[str, str]] = set()  # (interpreter, cache dir) this process checked


def cache_dir(data_dir: Path) -> Path:
    """Where the daemon's bytecode lives (created if missing)."""
    venv = Path(sys.prefix).resolve()
    writable = os.access(venv, os.W_OK)
    path = venv / "var" / "torpor-pycache" if writable else data_dir / "pycache"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _pyc(prefix: Path, source: Path) -> Path:
    # importlib's rule for a pycache_prefix: the source's absolute directory under the prefix.
    folder = source.resolve().parent
    tag = sys.implementation.cache_tag
    return prefix / str(folder).lstrip(os.sep) / f"{source.stem}.{tag}.pyc"


def stale(prefix: Path) -> bool:
    """True when the daemon's bytecode under ``prefix`` is missing or older than its sources.

    Cheap: the daemon's own files (what developers edit) and the package roots of its big
    dependencies."""
    spec = importlib.util.find_spec("services.envd")
    if spec is None or spec.origin is None:
        return False
    sources = list(Path(spec.origin).parent.rglob("*.py"))
    for name in _SENTINELS:
        dep = importlib.util.find_spec(name)
        if dep is not None and dep.origin is not None:
            sources.append(Path(dep.origin))
    for source in sources:
        try:
            if _pyc(prefix, source).stat().st_mtime < source.stat().st_mtime:
                return True
        except FileNotFoundError:
            return True
        except OSError:
            continue
    return False


async def precompile(python: str, prefix: Path) -> None:
    """``python -X pycache_prefix=<prefix> -m services.envd --precompile``; a failure only
    costs start-up time, so it is logged, not raised."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX"}
    }
    try:
        proc = await asyncio.create_subprocess_exec(
            python,
            "-X",
            f"pycache_prefix={prefix}",
            "-m",
            "services.envd",
            "--precompile",
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            env=env,
        )
        out, _ = await proc.communicate()
    except OSError as e:
        log.warning("runtime_local_precompile_failed", error=str(e))
        return
    if proc.returncode != 0:
        log.warning("runtime_local_precompile_failed", output=out.decode(errors="replace")[-300:])
    else:
        log.info("runtime_local_precompiled", output=out.decode(errors="replace").strip())


async def ensure(python: str, prefix: Path) -> None:
    """Precompile once per process (and cache dir) when the bytecode is stale."""
    key = (python, str(prefix))
    if key in _precompiled:
        return
    _precompiled.add(key)
    if await asyncio.to_thread(stale, prefix):
        await precompile(python, prefix)
