"""Finding or building ``torpor-wire`` (the proxy's compiled data path, ``services/proxy/wire``).

The binary is cached outside the repo under a hash of its sources, so a changed source is a new
build and a stale binary is never run; builds are serialised with a lock file. Without Go the
proxy relays everything in Python (``find_or_build`` returns None and says why)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "wire"
BUILD_TIMEOUT = 300.0


class WireUnavailableError(Exception):
    """No binary: the reason, in one line."""


def source_hash() -> str:
    digest = hashlib.sha256()
    for path in sorted(SOURCE.glob("*")):
        if path.suffix in (".go", ".mod") and not path.name.endswith("_test.go"):
            digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "torpor" / "wire"


def find_or_build(prebuilt: str = "") -> Path:
    """The binary's path; ``WireUnavailableError`` when there is none and Go cannot build one."""
    if prebuilt:
        path = Path(prebuilt)
        if not os.access(path, os.X_OK):
            msg = f"TORPOR_PROXY_WIRE_BINARY={prebuilt!r} is not an executable file"
            raise WireUnavailableError(msg)
        return path
    target = cache_root() / source_hash() / "torpor-wire"
    if os.access(target, os.X_OK):
        return target
    go = shutil.which("go")
    if go is None:
        msg = "go is not installed: the proxy relays every exchange in Python"
        raise WireUnavailableError(msg)
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.access(target, os.X_OK):
            return target
        with tempfile.TemporaryDirectory(dir=target.parent) as work:
            out = Path(work) / "torpor-wire"
            env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": ""}
            try:
                done = subprocess.run(
                    [go, "build", "-trimpath", "-o", str(out), "."],
                    cwd=SOURCE,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=BUILD_TIMEOUT,
                    check=False,
                )
            except subprocess.TimeoutExpired:
                msg = f"go build of {SOURCE} took over {BUILD_TIMEOUT:g}s"
                raise WireUnavailableError(msg) from None
            if done.returncode != 0:
                last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
                msg = f"go build of {SOURCE} failed: {last}"
                raise WireUnavailableError(msg)
            out.replace(target)
    return target


def main() -> int:
    """``python -m services.proxy.wire_build``: build ahead (setup, CI), print the path."""
    try:
        print(find_or_build())
    except WireUnavailableError as e:
        print(f"torpor-wire: {e}")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
