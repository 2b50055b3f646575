"""File metadata (envd 0.6.2): user-defined ``key: value`` pairs kept as ``user.e2b.<key>``
extended attributes on the file itself, so they follow it through renames and are visible to
code in the sandbox (and can be set by it, out of band).

Uploads carry them as ``X-Metadata-<key>`` headers (keys lowercased, like envd); every upload
replaces the whole set, so overwriting a file without metadata clears what it had.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re

XATTR_PREFIX = "user.e2b."
HEADER_PREFIX = "x-metadata-"
# The SDK's own rules (an HTTP token key, a printable US-ASCII value), checked again here: the
# daemon does not trust its client.
_KEY = re.compile(r"\A[A-Za-z0-9!#$%&'*+\-.^_`|~]+\Z")
_VALUE = re.compile(r"\A[\x20-\x7e]*\Z")
MAX_KEYS = 64
MAX_KEY_BYTES = 255 - len(XATTR_PREFIX)  # XATTR_NAME_MAX
MAX_TOTAL_BYTES = 3072  # ext4 keeps every xattr of a file in one block (4 KiB, with headers)


class MetadataError(ValueError):
    """Invalid metadata in a request (a 400)."""


def from_headers(headers: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The validated ``X-Metadata-*`` headers of a request, keys lowercased."""
    out: dict[str, str] = {}
    for raw_name, raw_value in headers:
        name = bytes(raw_name).decode("latin-1").lower()
        if not name.startswith(HEADER_PREFIX):
            continue
        key = name[len(HEADER_PREFIX) :]
        value = bytes(raw_value).decode("latin-1")
        if not _KEY.match(key) or len(key) > MAX_KEY_BYTES:
            raise MetadataError(f"invalid metadata key {key[:64]!r}")
        if not _VALUE.match(value):
            raise MetadataError(f"invalid metadata value for key {key!r}: printable ASCII only")
        out[key] = value
    if len(out) > MAX_KEYS:
        raise MetadataError(f"at most {MAX_KEYS} metadata keys")
    if sum(len(XATTR_PREFIX) + len(k) + len(v) for k, v in out.items()) > MAX_TOTAL_BYTES:
        raise MetadataError(f"metadata exceeds {MAX_TOTAL_BYTES} bytes")
    return out


def read(path: str) -> dict[str, str]:
    """The ``user.e2b.*`` attributes of ``path`` (not following a symlink); ``{}`` when the
    filesystem keeps none."""
    out: dict[str, str] = {}
    try:
        names = os.listxattr(path, follow_symlinks=False)
    except OSError:
        return out
    for name in names:
        if not name.startswith(XATTR_PREFIX):
            continue
        with contextlib.suppress(OSError):
            value = os.getxattr(path, name, follow_symlinks=False)
            out[name[len(XATTR_PREFIX) :]] = value.decode("utf-8", "replace")
    return out


def replace(fd: int, metadata: dict[str, str]) -> None:
    """Make ``metadata`` the file's whole set: stale ``user.e2b.*`` attributes are removed."""
    try:
        existing = os.listxattr(fd)
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.EOPNOTSUPP) and not metadata:
            return  # nothing to clear, nothing to set
        raise
    for name in existing:
        if name.startswith(XATTR_PREFIX) and name[len(XATTR_PREFIX) :] not in metadata:
            with contextlib.suppress(OSError):
                os.removexattr(fd, name)
    for key, value in metadata.items():
        os.setxattr(fd, XATTR_PREFIX + key, value.encode())
