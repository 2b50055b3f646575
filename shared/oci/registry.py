"""An OCI distribution API client (the registry adapter): blobs, manifests, tags.

Plain ``/v2`` calls: ``HEAD`` a blob, cross-repository mount, monolithic upload (``POST`` then
``PUT ?digest=``), ``PUT``/``GET``/``HEAD`` a manifest. Credentials, when configured, go as HTTP
basic auth and never into a log line or an error message.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urljoin

import httpx

from shared.errors import TorporError
from shared.oci.images import ACCEPTED_MANIFESTS, MANIFEST, digest_of, is_digest

# A repository name as the distribution spec has it (lowercase path components).
_REPO_RE = re.compile(
    r"^[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:\.|_|__|-+)[a-z0-9]+)*)*$"
)
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
MAX_MANIFEST_BYTES = 4 * 2**20
_CHUNK = 1024 * 1024


class RegistryError(TorporError):
    """The registry refused or failed a call (status and path, never credentials)."""


def check_repository(name: str) -> str:
    if len(name) > 255 or not _REPO_RE.match(name):
        raise ValueError(f"invalid repository name {name[:80]!r}")
    return name


def check_reference(ref: str) -> str:
    if not (is_digest(ref) or _TAG_RE.match(ref)):
        raise ValueError(f"invalid tag or digest {ref[:80]!r}")
    return ref


@dataclass(frozen=True)
class Manifest:
    digest: str
    media_type: str
    data: bytes


class Registry:
    """One registry (``host[:port]``); repositories are named by the caller (the builder)."""

    def __init__(
        self,
        host: str,
        *,
        insecure: bool = False,
        username: str | None = None,
        password: str | None = None,
        timeout: float = 300.0,
        http: httpx.AsyncClient | None = None,
    ) -> None:
        self.host = host
        self._base = f"{'http' if insecure else 'https'}://{host}"
        auth = httpx.BasicAuth(username, password or "") if username else None
        self._http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(timeout, connect=10.0), auth=auth, follow_redirects=True
        )

    async def close(self) -> None:
        await self._http.aclose()

    def _url(self, repo: str, tail: str) -> str:
        return f"{self._base}/v2/{check_repository(repo)}/{tail}"

    async def _call(self, method: str, url: str, **kw: object) -> httpx.Response:
        try:
            return await self._http.request(method, url, **kw)  # type: ignore[arg-type]
        except httpx.HTTPError as e:
            path = url.removeprefix(self._base)
            raise RegistryError(f"registry {self.host}: {method} {path}: {type(e).__name__}") from e

    @staticmethod
    def _refuse(resp: httpx.Response, what: str) -> RegistryError:
        body = (
            resp.text[:300]
            if resp.headers.get("content-type", "").startswith(("application/json", "text/"))
            else ""
        )
        return RegistryError(f"registry refused {what}: {resp.status_code} {body}".strip())

    async def ping(self) -> None:
        resp = await self._call("GET", f"{self._base}/v2/")
        if resp.status_code != 200:
            raise self._refuse(resp, "/v2/")

    # ---- blobs ------------------------------------------------------------------------------

    async def has_blob(self, repo: str, digest: str) -> bool:
        resp = await self._call("HEAD", self._url(repo, f"blobs/{digest}"))
        if resp.status_code == 200:
            return True
        if resp.status_code == 404:
            return False
        raise self._refuse(resp, f"HEAD blob {digest}")

    async def mount_blob(self, repo: str, digest: str, *, source: str) -> bool:
        """Cross-repository mount; ``False`` when the registry would rather have the bytes."""
        check_repository(source)
        resp = await self._call(
            "POST", self._url(repo, "blobs/uploads/"), params={"mount": digest, "from": source}
        )
        if resp.status_code == 201:
            return True
        if resp.status_code == 202:
            location = resp.headers.get("location")
            if location:  # an upload session we will not use
                await self._call("DELETE", urljoin(self._base + "/", location))
            return False
        raise self._refuse(resp, f"mount of {digest}")

    async def push_blob(self, repo: str, path: Path, digest: str) -> None:
        """Upload ``path`` (whose sha256 is ``digest``) unless the repository has it."""
        if await self.has_blob(repo, digest):
            return

        async def chunks() -> AsyncIterator[bytes]:
            f = await asyncio.to_thread(path.open, "rb")
            try:
                while chunk := await asyncio.to_thread(f.read, _CHUNK):
                    yield chunk
            finally:
                f.close()

        size = (await asyncio.to_thread(path.stat)).st_size
        await self._upload(repo, digest, chunks(), size)

    async def push_bytes(self, repo: str, data: bytes) -> str:
        digest = digest_of(data)
        if not await self.has_blob(repo, digest):

            async def one() -> AsyncIterator[bytes]:
                yield data

            await self._upload(repo, digest, one(), len(data))
        return digest

    async def copy_blob(self, repo: str, digest: str, *, source: str) -> None:
        """Make ``digest`` of ``source`` present in ``repo``: already there, mounted, or
        streamed through this process."""
        if await self.has_blob(repo, digest) or await self.mount_blob(repo, digest, source=source):
            return
        url = self._url(source, f"blobs/{digest}")
        async with self._http.stream("GET", url) as resp:
            if resp.status_code != 200:
                raise self._refuse(resp, f"GET blob {digest}")
            size = int(resp.headers.get("content-length", "0"))
            await self._upload(repo, digest, resp.aiter_bytes(_CHUNK), size)

    async def _upload(self, repo: str, digest: str, body: AsyncIterator[bytes], size: int) -> None:
        start = await self._call("POST", self._url(repo, "blobs/uploads/"))
        location = start.headers.get("location")
        if start.status_code != 202 or not location:
            raise self._refuse(start, f"upload of {digest}")
        url = urljoin(self._base + "/", location)
        done = await self._call(
            "PUT",
            url,
            params={"digest": digest},
            content=body,
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        )
        if done.status_code != 201:
            raise self._refuse(done, f"upload of {digest}")

    async def get_blob(self, repo: str, digest: str, *, limit: int = MAX_MANIFEST_BYTES) -> bytes:
        resp = await self._call("GET", self._url(repo, f"blobs/{digest}"))
        if resp.status_code != 200:
            raise self._refuse(resp, f"GET blob {digest}")
        data = resp.content
        if len(data) > limit or digest_of(data) != digest:
            raise RegistryError(f"blob {digest} of {repo} does not match its digest")
        return data

    # ---- manifests --------------------------------------------------------------------------

    async def put_manifest(self, repo: str, ref: str, data: bytes) -> str:
        resp = await self._call(
            "PUT",
            self._url(repo, f"manifests/{check_reference(ref)}"),
            content=data,
            headers={"Content-Type": MANIFEST},
        )
        if resp.status_code != 201:
            raise self._refuse(resp, f"manifest {repo}:{ref}")
        return digest_of(data)

    async def get_manifest(self, repo: str, ref: str) -> Manifest | None:
        resp = await self._call(
            "GET",
            self._url(repo, f"manifests/{check_reference(ref)}"),
            headers={"Accept": ", ".join(ACCEPTED_MANIFESTS)},
        )
        if resp.status_code == 404:
            return None
        if resp.status_code != 200:
            raise self._refuse(resp, f"manifest {repo}:{ref}")
        data = resp.content
        if len(data) > MAX_MANIFEST_BYTES:
            raise RegistryError(f"manifest {repo}:{ref} too large")
        digest = digest_of(data)
        if is_digest(ref) and digest != ref:
            raise RegistryError(f"manifest {repo}@{ref} does not match its digest")
        media = resp.headers.get("content-type", MANIFEST).split(";")[0].strip()
        return Manifest(digest=digest, media_type=media, data=data)

    async def tags(self, repo: str) -> list[str]:
        resp = await self._call("GET", self._url(repo, "tags/list"))
        if resp.status_code == 404:
            return []
        if resp.status_code != 200:
            raise self._refuse(resp, f"tags of {repo}")
        return [str(t) for t in (resp.json().get("tags") or [])]
