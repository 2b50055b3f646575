"""The HTTP adapter ``torpor sandbox`` uses: torpor's native REST API over httpx.

Answers become small frozen models; failures become ``ApiCallFailed`` with one readable line
(the server's ``message`` when it sent one). The API key travels only in the Authorization header
and never appears in an error message.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from shared.errors import TorporError


class ApiCallFailed(TorporError):
    def __init__(self, message: str, *, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class _In(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", populate_by_name=True)


class RemoteSnapshot(_In):
    annotation: str
    captured_at: str = Field(alias="capturedAt")
    process_count: int = Field(alias="processCount")


class RemoteSandbox(_In):
    name: str
    sandbox_id: str | None = Field(default=None, alias="sandboxId")  # for the SDK and the proxy
    owner: str
    template: str
    state: str
    timeout: int
    auto_pause: bool = Field(alias="autoPause")
    auto_resume: bool = Field(alias="autoResume")
    metadata: dict[str, str] = Field(default_factory=dict)
    created_at: datetime = Field(alias="createdAt")
    started_at: datetime = Field(alias="startedAt")
    deadline: datetime | None = None
    paused_at: datetime | None = Field(default=None, alias="pausedAt")
    retain_until: datetime | None = Field(default=None, alias="retainUntil")
    snapshot: RemoteSnapshot | None = None
    failure: str | None = None


class RemoteEvent(_In):
    seq: int | None = None
    fact: str
    sandbox_id: str = Field(alias="sandboxId")
    at: datetime | None = None
    data: dict[str, Any] = Field(default_factory=dict)


class SandboxApi:
    """One torpor API (``base_url``) as one user (``api_key``)."""

    def __init__(self, base_url: str, api_key: str, *, timeout: float = 90.0) -> None:
        self._base = base_url.rstrip("/")
        self._client = httpx.Client(
            base_url=self._base + "/api/v1",
            headers={"Authorization": f"Bearer {api_key}", "User-Agent": "torpor-cli"},
            # Transitions answer when done; the server gives up after ~55 s (then 504).
            timeout=httpx.Timeout(timeout, connect=5.0),
        )

    def __enter__(self) -> SandboxApi:
        return self

    def __exit__(self, *_: object) -> None:
        self._client.close()

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        try:
            response = self._client.request(method, path, **kwargs)
        except httpx.TimeoutException:
            msg = f"the torpor API at {self._base} did not answer in time"
            raise ApiCallFailed(msg) from None
        except httpx.HTTPError as e:
            msg = f"cannot reach the torpor API at {self._base} ({type(e).__name__})"
            raise ApiCallFailed(msg) from None
        if response.status_code == 204:
            return None
        try:
            body = response.json()
        except ValueError:
            body = None
        if response.is_error:
            message = body.get("message") if isinstance(body, dict) else None
            if response.status_code == 401:
                message = f"{message or 'unauthorized'} (check E2B_API_KEY / --api-key)"
            raise ApiCallFailed(
                message or f"HTTP {response.status_code} from {self._base}",
                status=response.status_code,
            )
        return body

    def _sandbox(self, body: Any) -> RemoteSandbox:
        try:
            return RemoteSandbox.model_validate(body)
        except ValidationError as e:
            msg = f"unexpected answer from {self._base}: {e.errors()[0]['msg']}"
            raise ApiCallFailed(msg) from None

    def sandboxes(self) -> list[RemoteSandbox]:
        body = self._call("GET", "/sandbox")
        items = body.get("sandboxes", []) if isinstance(body, dict) else []
        return [self._sandbox(item) for item in items]

    def get(self, name: str) -> RemoteSandbox:
        return self._sandbox(self._call("GET", f"/sandbox/{name}"))

    def create(
        self,
        *,
        name: str | None,
        template: str | None,
        timeout: int | None,
        auto_pause: bool,
        auto_resume: bool,
        metadata: dict[str, str],
        envs: dict[str, str],
    ) -> RemoteSandbox:
        payload: dict[str, Any] = {
            "autoPause": auto_pause,
            "autoResume": auto_resume,
            "metadata": metadata,
            "envs": envs,
        }
        if name:
            payload["name"] = name
        if template:
            payload["template"] = template
        if timeout is not None:
            payload["timeout"] = timeout
        return self._sandbox(self._call("POST", "/sandbox", json=payload))

    def pause(self, name: str) -> RemoteSandbox:
        return self._sandbox(self._call("POST", f"/sandbox/pause/{name}"))

    def resume(self, name: str) -> RemoteSandbox:
        return self._sandbox(self._call("POST", f"/sandbox/resume/{name}"))

    def kill(self, name: str) -> None:
        self._call("DELETE", f"/sandbox/{name}")

    def events(self, name: str, *, limit: int = 200) -> list[RemoteEvent]:
        body = self._call("GET", f"/sandbox/{name}/events", params={"limit": limit})
        items = body.get("events", []) if isinstance(body, dict) else []
        try:
            return [RemoteEvent.model_validate(item) for item in items]
        except ValidationError as e:
            msg = f"unexpected answer from {self._base}: {e.errors()[0]['msg']}"
            raise ApiCallFailed(msg) from None
