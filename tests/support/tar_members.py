"""Tar archives built member by member, for the tests of what unpacks them (COPY contexts, OCI
layers, kept-file imports): any name, type and field, hostile ones included."""

from __future__ import annotations

import io
import tarfile
from collections.abc import Iterable
from pathlib import Path

Members = Iterable[tuple[tarfile.TarInfo, bytes | None]]


def member(name: str, kind: bytes = tarfile.REGTYPE, **fields: object) -> tarfile.TarInfo:
    """A member ``name`` of type ``kind`` (0o755 for a folder, else 0o644), ``fields`` set as
    they are given (``linkname``, ``uid``, ``mode``, ...)."""
    info = tarfile.TarInfo(name)
    info.type = kind
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    return info


def _add(tar: tarfile.TarFile, members: Members) -> None:
    for info, data in members:
        if data is not None:
            info.size = len(data)
        tar.addfile(info, io.BytesIO(data) if data is not None else None)


def write_tar(path: Path, members: Members) -> Path:
    """A PAX archive of ``members`` (each with its data, or None) at ``path``."""
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, members)
    return path


def tar_bytes(members: Members) -> bytes:
    """The PAX archive of ``members``, in memory."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add(tar, members)
    return buf.getvalue()
