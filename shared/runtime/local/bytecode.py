"""The daemon's bytecode cache: compiled once by the runtime, read-only inside pods.

Pods see the code read-only, so a daemon without fresh bytecode compiles its imports on every
start (a few hundred ms to seconds). The runtime never writes into the source tree: bytecode
goes to a ``pycache_prefix`` directory beside the daemon's interpreter tree (see
.daemon_python: in the venv, shared by every runtime of that interpreter, so a fresh data dir
costs nothing, or under the data dir when the venv is read-only). The daemon
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

from shared.runtime.local import bwrap, mounts
from shared.runtime.local.daemon_python import DaemonPython
from shared.runtime.local.pod_commands import DAEMON_CODE, DAEMON_DIR, bootstrap, daemon_flags

log = structlog.get_logger()

_SENTINELS = ("uvicorn", "connectrpc", "protobuf")  # big third-party imports
_precompiled: set[tuple[str, str]] = set()  # (interpreter, cache dir) this process checked


def cache_dir(daemon: DaemonPython) -> Path:
    """Where the daemon's bytecode lives (created if missing): beside its interpreter tree."""
    daemon.pycache.mkdir(mode=0o755, exist_ok=True)
    return daemon.pycache


def _pyc(prefix: Path, source: Path) -> Path:
    # importlib's rule for a pycache_prefix: the source's absolute directory under the prefix.
    folder = source.parent
    tag = sys.implementation.cache_tag
    return prefix / str(folder).lstrip(os.sep) / f"{source.stem}.{tag}.pyc"


def stale(daemon: DaemonPython, prefix: Path) -> bool:
    """True when the daemon's bytecode under ``prefix`` is missing or older than its sources.

    Cheap: the daemon's own files (what developers edit, cached by their path inside the pod,
    see :data:`.pod_commands.DAEMON_CODE`) and the package roots of its big dependencies."""
    spec = importlib.util.find_spec("services.envd")
    if spec is None or spec.origin is None:
        return False
    envd = Path(spec.origin).resolve().parent
    inside = Path(DAEMON_CODE) / "services" / "envd"
    sources = [(s, inside / s.relative_to(envd)) for s in envd.rglob("*.py")]
    for name in _SENTINELS:
        dep = importlib.util.find_spec(name)
        if dep is not None and dep.origin is not None:
            sources.append((Path(dep.origin), daemon.inside(Path(dep.origin).resolve())))
    for source, cached_as in sources:
        try:
            if _pyc(prefix, cached_as).stat().st_mtime < source.stat().st_mtime:
                return True
        except FileNotFoundError:
            return True
        except OSError:
            continue
    return False


# Run as root in a private mount namespace: the daemon's interpreter and package where pods have
# them (a tmpfs on DAEMON_DIR, each bound into it), then the rest of argv (the daemon's
# --precompile): its bytecode is cached by the paths the pod's daemon imports it from.
_PRECOMPILE_SCRIPT = """set -e
dir=$1; envd=$2; init=$3; py=$4; shift 4
mount -t tmpfs -o mode=0755,size=64k,nosuid,nodev torpor-precompile "$dir"
mkdir -p "$dir/code/services/envd" "$dir/py"
: > "$dir/code/services/__init__.py"
mount --bind -o ro "$envd" "$dir/code/services/envd"
mount --bind -o ro "$init" "$dir/code/services/__init__.py"
mount --bind -o ro "$py" "$dir/py"
exec "$@"
"""


async def precompile(daemon: DaemonPython, prefix: Path) -> None:
    """``python -X pycache_prefix=<prefix> -m services.envd --precompile`` with the daemon's
    package at its path inside pods; a failure only costs start-up time, so it is logged, not
    raised."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYTHONDONTWRITEBYTECODE", "PYTHONPYCACHEPREFIX"}
    }
    envd, package_init = bwrap.daemon_package()
    try:
        await asyncio.to_thread(os.makedirs, DAEMON_DIR, 0o755, exist_ok=True)
        proc = await asyncio.create_subprocess_exec(
            *mounts.private_shell(_PRECOMPILE_SCRIPT, "torpor-precompile"),
            DAEMON_DIR,
            str(envd),
            str(package_init),
            str(daemon.tree),
            daemon.executable,
            *daemon_flags(str(prefix)),
            *bootstrap("services.envd"),
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


async def ensure(daemon: DaemonPython, prefix: Path) -> None:
    """Precompile once per process (and cache dir) when the bytecode is stale."""
    key = (str(daemon.tree), str(prefix))
    if key in _precompiled:
        return
    _precompiled.add(key)
    if await asyncio.to_thread(stale, daemon, prefix):
        await precompile(daemon, prefix)
