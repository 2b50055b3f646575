"""Layer archives: what a build pod hands back is hostile input.

A step's layer comes out of the tenant's own build pod as a tar (``services.builder.pod_diff``).
Before it is pushed, :func:`repack` reads it member by member and writes a new archive with only
what an image layer may hold, or refuses it with :class:`BadLayer`:

- names relative, normalized, no ``..``, no NUL or control bytes, bounded length;
- regular files, folders, symlinks, fifos, and hard links to a member earlier in the same
  archive; never device nodes;
- OCI whiteouts (``.wh.<name>``: ``<name>`` is deleted below; ``.wh..wh..opq``: the folder is
  opaque) only as empty regular files naming one plain entry; any other ``.wh.`` name is refused;
- owners numeric (user names dropped), setuid/setgid/sticky bits dropped (a sandbox runs with
  no_new_privs: they would never work, and a layer has no business asking);
- bounded member count and bytes.

The output is an uncompressed tar (``application/vnd.oci.image.layer.v1.tar``: its digest is
its diff id), written once while hashing.
"""

from __future__ import annotations

import hashlib
import posixpath
import stat
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO

WHITEOUT_PREFIX = ".wh."
OPAQUE_WHITEOUT = ".wh..wh..opq"
MAX_NAME_BYTES = 4096
MAX_MEMBERS = 500_000
MAX_LAYER_BYTES = 8 * 2**30
_CHUNK = 1024 * 1024


class BadLayer(ValueError):
    """The archive is not a layer torpor pushes (the message names the member)."""


@dataclass(frozen=True)
class Blob:
    digest: str  # sha256:<hex>
    size: int


def check_name(name: str) -> str:
    """The member name as the layer keeps it (``a/b``), or :class:`BadLayer`."""
    if not name or len(name.encode("utf-8", "surrogateescape")) > MAX_NAME_BYTES:
        raise BadLayer(f"member name of bad length: {name[:80]!r}")
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in name):
        raise BadLayer(f"member name with a control byte: {name[:80]!r}")
    if name.startswith("/"):
        raise BadLayer(f"absolute member name: {name[:80]!r}")
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if not parts:
        raise BadLayer(f"member names the root: {name[:80]!r}")
    if ".." in parts:
        raise BadLayer(f"member name with '..': {name[:80]!r}")
    for part in parts[:-1]:
        if part.startswith(WHITEOUT_PREFIX):
            raise BadLayer(f"whiteout name used as a folder: {name[:80]!r}")
    return "/".join(parts)


def whiteout_target(name: str) -> str | None:
    """For a whiteout member, what it deletes (``a/b`` for ``a/.wh.b``; ``a/`` for an opaque
    ``a/.wh..wh..opq``); ``None`` for a plain member. :class:`BadLayer` for a bad whiteout."""
    folder, _, base = name.rpartition("/")
    if not base.startswith(WHITEOUT_PREFIX):
        return None
    if base == OPAQUE_WHITEOUT:
        return f"{folder}/" if folder else "/"
    target = base[len(WHITEOUT_PREFIX) :]
    if target in ("", ".", "..") or target.startswith(WHITEOUT_PREFIX):
        raise BadLayer(f"malformed whiteout: {name[:80]!r}")
    return f"{folder}/{target}" if folder else target


def whiteout_name(path: str) -> str:
    """The whiteout member that deletes ``path`` (a checked member name)."""
    folder, _, base = check_name(path).rpartition("/")
    if base.startswith(WHITEOUT_PREFIX):
        raise BadLayer(f"cannot delete a whiteout-named entry: {path[:80]!r}")
    return f"{folder}/{WHITEOUT_PREFIX}{base}" if folder else f"{WHITEOUT_PREFIX}{base}"


def _clean(member: tarfile.TarInfo, seen: set[str]) -> tarfile.TarInfo:
    name = check_name(member.name)
    if whiteout_target(name) is not None and not (member.isreg() and member.size == 0):
        raise BadLayer(f"a whiteout must be an empty regular file: {name[:80]!r}")
    out = tarfile.TarInfo(name)
    out.mode = stat.S_IMODE(member.mode) & 0o777
    out.uid, out.gid = member.uid, member.gid
    if not (0 <= out.uid < 2**31 and 0 <= out.gid < 2**31):
        raise BadLayer(f"bad owner of {name[:80]!r}")
    out.uname = out.gname = ""
    out.mtime = int(member.mtime) if 0 <= member.mtime < 2**33 else 0
    if member.isreg():
        out.type, out.size = tarfile.REGTYPE, member.size
    elif member.isdir():
        out.type = tarfile.DIRTYPE
    elif member.issym():
        target = member.linkname
        if not target or "\0" in target or len(target) > MAX_NAME_BYTES:
            raise BadLayer(f"bad symlink target of {name[:80]!r}")
        out.type, out.linkname = tarfile.SYMTYPE, target
    elif member.islnk():
        target = check_name(member.linkname)
        if target not in seen or target == name:
            raise BadLayer(f"hard link {name[:80]!r} to a file not earlier in the layer")
        out.type, out.linkname = tarfile.LNKTYPE, target
    elif member.isfifo():
        out.type = tarfile.FIFOTYPE
    else:
        raise BadLayer(f"unsupported member type of {name[:80]!r} (devices are refused)")
    return out


class _Hashing:
    def __init__(self, raw: IO[bytes], limit: int) -> None:
        self._raw = raw
        self._limit = limit
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.size += len(data)
        if self.size > self._limit:
            raise BadLayer(f"layer larger than {self._limit} bytes")
        self.sha.update(data)
        return self._raw.write(data)

    def flush(self) -> None:
        self._raw.flush()


def repack(
    source: Path,
    dest: Path,
    *,
    max_members: int = MAX_MEMBERS,
    max_bytes: int = MAX_LAYER_BYTES,
) -> Blob:
    """Check ``source`` (any tar, possibly compressed) and write the clean layer to ``dest``."""
    seen: set[str] = set()
    count = 0
    try:
        with (
            tarfile.open(source, "r:*") as tar,
            dest.open("wb") as raw,
        ):
            sink = _Hashing(raw, max_bytes)
            with tarfile.open(fileobj=sink, mode="w|", format=tarfile.PAX_FORMAT) as out:  # type: ignore[call-overload]
                for member in tar:
                    count += 1
                    if count > max_members:
                        raise BadLayer(f"layer with more than {max_members} members")
                    clean = _clean(member, seen)
                    if clean.name in seen and not clean.isdir():
                        raise BadLayer(f"member listed twice: {clean.name[:80]!r}")
                    seen.add(clean.name)
                    data = tar.extractfile(member) if member.isreg() else None
                    out.addfile(clean, data)
            sink.flush()
    except (tarfile.TarError, EOFError) as e:
        raise BadLayer(f"not a readable tar archive: {e}") from e
    return Blob(digest=f"sha256:{sink.sha.hexdigest()}", size=sink.size)


def file_blob(path: Path) -> Blob:
    sha = hashlib.sha256()
    size = 0
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return Blob(digest=f"sha256:{sha.hexdigest()}", size=size)


def normalize_path(path: str) -> str:
    """An absolute path inside the image, normalized (``..`` refused, not resolved)."""
    if "\0" in path or not path.startswith("/"):
        raise BadLayer(f"not an absolute path: {path[:80]!r}")
    if ".." in path.split("/"):
        raise BadLayer(f"path with '..': {path[:80]!r}")
    return posixpath.normpath(path)
