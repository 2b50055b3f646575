"""E2B's COPY for the Kubernetes builder: the uploaded build context's matching entries as a tar
to unpack at ``/`` in the build pod (``tar --no-overwrite-dir``: folders that exist keep their
owner and mode, new ones get the copy's owner), so the step's layer is what the pod's diff sees.

The same rules as the local runtime's ``template_layers.copy_in`` (Docker's): ``src`` is a path
or glob relative to the context (a folder copies its contents), ``dest`` is relative to the
working folder; one file to a ``dest`` not ending in ``/`` is that file's new name. Read straight
from the archive, never unpacked on the builder: no member can lead anywhere on this host.
"""

from __future__ import annotations

import fnmatch
import tarfile
from pathlib import Path, PurePosixPath

from shared.oci.layers import BadLayer, check_name

MAX_CONTEXT_MEMBERS = 100_000


class BadCopy(ValueError):
    """The COPY cannot be made (the message is the user's to read)."""


def _check_relative(value: str, what: str) -> PurePosixPath:
    if not value or "\0" in value or any(ord(c) < 0x20 for c in value):
        raise BadCopy(f"COPY {what} {value[:80]!r} is not a valid path")
    path = PurePosixPath(value)
    if ".." in path.parts:
        raise BadCopy(f"COPY {what} {value[:80]!r} may not contain '..'")
    return path


def copy_tar(
    archive: Path,
    out: Path,
    *,
    src: str,
    dest: str,
    workdir: str,
    owner: int,
    mode: int | None,
) -> int:
    """Write the tar of what the COPY puts where (names relative to ``/``); the entries
    copied (folders on the way to the target included)."""
    source = _check_relative(src, "source")
    if source.is_absolute():
        raise BadCopy(f"COPY source {src[:80]!r} must be relative to the build context")
    _check_relative(dest, "destination")
    target = PurePosixPath(workdir) / dest
    if not target.is_absolute() or ".." in target.parts:
        raise BadCopy(f"COPY destination {dest[:80]!r} may not contain '..'")
    pattern = [p for p in source.parts if p != "."]
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = []
            for count, member in enumerate(tar, 1):
                if count > MAX_CONTEXT_MEMBERS:
                    raise BadCopy(f"the build context has more than {MAX_CONTEXT_MEMBERS} entries")
                try:
                    name = check_name(member.name)
                except BadLayer as e:
                    raise BadCopy(f"the build context holds a bad entry: {e}") from e
                members.append((name, member))
            return _write(tar, members, out, pattern, src, dest, target, owner, mode)
    except (tarfile.TarError, EOFError) as e:
        raise BadCopy(f"cannot read the copied files: {e}") from e


def _write(  # noqa: PLR0917 - one call site, the COPY's parts
    tar: tarfile.TarFile,
    members: list[tuple[str, tarfile.TarInfo]],
    out: Path,
    pattern: list[str],
    src: str,
    dest: str,
    target: PurePosixPath,
    owner: int,
    mode: int | None,
) -> int:
    n = len(pattern)
    matched: dict[str, tarfile.TarInfo] = {}
    inside: list[tuple[str, str, tarfile.TarInfo]] = []  # (match, rest, member)
    for name, member in members:
        parts = name.split("/")
        if n == 0 or len(parts) < n:
            if n == 0:  # "." : the whole context
                inside.append(("", name, member))
            continue
        if all(fnmatch.fnmatchcase(p, q) for p, q in zip(parts[:n], pattern, strict=False)):
            head = "/".join(parts[:n])
            if len(parts) == n:
                matched[head] = member
            else:
                inside.append((head, "/".join(parts[n:]), member))
    if n and not matched and not inside:
        raise BadCopy(f"COPY source {src[:80]!r} matched no file")
    single_file = (
        n > 0 and len(matched) == 1 and not inside and next(iter(matched.values())).isfile()
    )
    into_folder = dest.endswith("/") or not single_file
    folder = target if into_folder else target.parent
    entries: list[tuple[str, tarfile.TarInfo]] = []
    for head, member in sorted(matched.items()):
        if member.isdir():
            continue  # its contents come through ``inside``
        base = PurePosixPath(head).name if into_folder else target.name
        entries.append((str(folder / base), member))
    for _head, rest, member in inside:
        entries.append((str(folder / rest), member))
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as sink:
        made: set[str] = set()
        current = PurePosixPath("/")
        for part in folder.parts[1:]:  # the folders on the way, as the local runtime makes them
            current = current / part
            _add_dir(sink, str(current), owner, made)
        copied = 0
        for path, member in sorted(entries, key=lambda e: e[0]):
            rel = path.lstrip("/")
            for parent in reversed(PurePosixPath(rel).parents[:-1]):
                _add_dir(sink, "/" + str(parent), owner, made)
            copied += _add(tar, sink, rel, member, owner, mode, made)
    return copied


def _add_dir(sink: tarfile.TarFile, path: str, owner: int, made: set[str]) -> None:
    rel = path.lstrip("/")
    if not rel or rel in made:
        return
    info = tarfile.TarInfo(rel)
    info.type, info.mode, info.uid, info.gid = tarfile.DIRTYPE, 0o755, owner, owner
    sink.addfile(info)
    made.add(rel)


def _add(  # noqa: PLR0917 - one call site
    tar: tarfile.TarFile,
    sink: tarfile.TarFile,
    rel: str,
    member: tarfile.TarInfo,
    owner: int,
    mode: int | None,
    made: set[str],
) -> int:
    info = tarfile.TarInfo(rel)
    info.uid = info.gid = owner
    info.mtime = member.mtime
    if member.isdir():
        info.type, info.mode = tarfile.DIRTYPE, member.mode & 0o777 or 0o755
        if rel in made:
            return 0
        made.add(rel)
        sink.addfile(info)
        return 0
    if member.issym():
        info.type, info.linkname, info.mode = tarfile.SYMTYPE, member.linkname, 0o777
        sink.addfile(info)
        return 1
    if not (member.isfile() or member.islnk()):
        raise BadCopy(f"the build context entry {member.name[:80]!r} is not a file or folder")
    data = tar.extractfile(member)
    if data is None:
        raise BadCopy(f"cannot read {member.name[:80]!r} of the build context")
    info.type = tarfile.REGTYPE
    info.mode = mode if mode is not None else (member.mode & 0o777)
    info.size = member.size if member.isfile() else _size_of(tar, member)
    sink.addfile(info, data)
    return 1


def _size_of(tar: tarfile.TarFile, member: tarfile.TarInfo) -> int:
    data = tar.extractfile(member)
    return len(data.read()) if data is not None else 0
