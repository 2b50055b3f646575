"""Build-context uploads: the SDK's presigned upload URL, served by the API itself.

``GET /templates/{id}/files/{hash}`` answers a URL ``<api>/templates/uploads/<token>``; the SDK
PUTs the tar archive there with no API key (as to an S3 presigned URL). The token is the
upload's owner, template id, files hash and expiry, signed with HMAC-SHA256: it cannot be
forged, altered to another hash or owner, or used after it expires. The gate checks it before
reading a byte of the body (``services.api.gate``).

Archives are stored content-addressed per owner, ``<data dir>/template-files/<owner digest>/
<files hash>.tar``: a user's hash names only that user's upload, so no one can plant an archive
under a hash another user's build will ask for.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from shared.models.template_records import blob_path, is_files_hash, is_template_id

UPLOAD_PREFIX = "/templates/uploads/"
TOKEN_SECONDS = 3600  # as E2B's presigned URLs: an hour to upload


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


@dataclass(frozen=True)
class Grant:
    owner: str
    template_id: str
    files_hash: str
    expires: int


class UploadSigner:
    def __init__(self, key: bytes) -> None:
        self._key = key

    def sign(self, grant: Grant) -> str:
        body = _b64(
            json.dumps(
                {
                    "o": grant.owner,
                    "t": grant.template_id,
                    "h": grant.files_hash,
                    "e": grant.expires,
                },
                separators=(",", ":"),
            ).encode()
        )
        return f"{body}.{self._mac(body)}"

    def verify(self, token: str, *, now: float | None = None) -> Grant | None:
        """The grant of a valid, unexpired token; ``None`` for anything else."""
        if len(token) > 2048:
            return None
        body, sep, mac = token.partition(".")
        if not sep or not hmac.compare_digest(mac, self._mac(body)):
            return None
        try:
            data = json.loads(_unb64(body))
            grant = Grant(str(data["o"]), str(data["t"]), str(data["h"]), int(data["e"]))
        except (ValueError, KeyError, TypeError):
            return None
        if grant.expires < (now if now is not None else time.time()):
            return None
        if not is_files_hash(grant.files_hash) or not is_template_id(grant.template_id):
            return None
        return grant

    def _mac(self, body: str) -> str:
        return _b64(hmac.new(self._key, body.encode(), hashlib.sha256).digest())


def store_blob(root: Path, owner: str, files_hash: str, data: bytes) -> None:
    """Write the archive atomically (a half-written one is never seen under its name)."""
    path = blob_path(root, owner, files_hash)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    partial = path.with_name(f".{files_hash}.{os.getpid()}.{time.monotonic_ns()}.partial")
    with open(partial, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def touch_blob(root: Path, owner: str, files_hash: str) -> bool:
    """Whether the archive is uploaded; if so its time is now: the builder's garbage collection
    removes archives unused for a while (BuilderSettings.gc_upload_max_age), and the SDK, told
    it is present, will not upload it again before its build."""
    path = blob_path(root, owner, files_hash)
    try:
        os.utime(path)
    except OSError:
        return False
    return path.is_file()
