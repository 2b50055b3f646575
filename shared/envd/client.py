"""``ConnectEnvdClient``: the control plane's client for the in-sandbox daemon.

Connect protocol with the JSON codec over httpx (HTTP/1.1): ``process.Process/List`` as a unary
call, ``process.Process/Start`` as a server stream of which only the first (start) event is read.
The Start request carries no ``Connect-Timeout-Ms`` because envd turns that header into the
process's deadline; the ``timeout`` argument bounds only the wait for the start event. Closing the
stream afterwards does not stop the process (envd keeps it running, like the SDK's
``background=True, timeout=0``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import struct
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import structlog
from pydantic import BaseModel

from shared.errors import EnvdError, EnvdUnavailable
from shared.models.snapshots import ProcessConfig, SnapshotProcess
from shared.models.telemetry import LogEntry, MetricSample
from shared.ports.envd import CommandResult, InnerActivity
from shared.ports.workloads import Endpoint

log = structlog.get_logger()
_Model = TypeVar("_Model", bound=BaseModel)

_ENVELOPE = struct.Struct(">BI")
_END_STREAM = 0x02
_COMPRESSED = 0x01
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
# HTTP statuses that mean "not reachable right now" rather than "the daemon said no".
_UNAVAILABLE_STATUSES = {502, 503, 504}
# What ``run_command`` keeps of a command's output (its tail): an outcome, not a log.
COMMAND_OUTPUT_TAIL = 8 * 1024
# Beyond the command's own deadline (enforced by the daemon), how long to wait for its end event.
_COMMAND_GRACE = 5.0
_FILE_CHUNK = 1024 * 1024


def _headers(access_token: str | None, *, streaming: bool) -> dict[str, str]:
    headers = {
        "Content-Type": "application/connect+json" if streaming else "application/json",
        "Connect-Protocol-Version": "1",
    }
    if access_token:
        headers["X-Access-Token"] = access_token
    return headers


def _error_from_body(status: int, body: bytes) -> EnvdError | EnvdUnavailable:
    code, message = f"http_{status}", body[:200].decode("utf-8", "replace")
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        if isinstance(data.get("code"), str):
            code = data["code"]
        if isinstance(data.get("message"), str):
            message = data["message"]
    if status in _UNAVAILABLE_STATUSES or code == "unavailable":
        return EnvdUnavailable(f"envd unavailable ({status}): {message}")
    return EnvdError(f"envd error {code}: {message}", code=code)


def _envelope(message: dict[str, Any]) -> bytes:
    data = json.dumps(message, separators=(",", ":")).encode()
    return _ENVELOPE.pack(0, len(data)) + data


def _process_json(config: ProcessConfig) -> dict[str, Any]:
    process: dict[str, Any] = {"cmd": config.cmd, "args": list(config.args)}
    if config.envs:
        process["envs"] = dict(config.envs)
    if config.cwd:
        process["cwd"] = config.cwd
    return process


def _deadline_ms(timeout: float) -> str:
    # Connect-Timeout-Ms: the daemon makes it the call's (for Start, the process's) deadline.
    return str(max(int(timeout * 1000), 1))


def _basic(user: str) -> str:
    # envd runs a process as the Basic auth user name (no password), like E2B's.
    return "Basic " + base64.b64encode(f"{user}:".encode()).decode()


def _unreachable(endpoint: Endpoint, exc: httpx.TransportError) -> EnvdUnavailable:
    return EnvdUnavailable(f"envd at {endpoint.base_url} unreachable: {exc!r}")


@contextlib.asynccontextmanager
async def _reading(endpoint: Endpoint, response: httpx.Response) -> AsyncIterator[None]:
    """While a Start stream is read: a broken transport is ``EnvdUnavailable``; the stream is
    closed however the reading ends (the process keeps running; only the stream ends)."""
    try:
        yield
    except httpx.TransportError as exc:
        raise EnvdUnavailable(f"envd stream from {endpoint.base_url} broke: {exc!r}") from exc
    finally:
        await response.aclose()


def _no_end() -> EnvdError:
    return EnvdError("envd ended the stream before the end event", code="internal")


def _listed(response: httpx.Response, path: str, model: type[_Model], what: str) -> list[_Model]:
    """A JSON list of ``model`` items (``/metrics``, ``/logs``); ``what`` names bad ones."""
    try:
        data = response.json()
    except ValueError as exc:
        raise EnvdError(f"envd sent invalid JSON on {path}: {exc}", code="internal") from exc
    if not isinstance(data, list):
        raise EnvdError(f"envd sent a non-list on {path}", code="internal")
    try:
        return [model.model_validate(item) for item in data]
    except ValueError as exc:
        raise EnvdError(f"envd sent {what}: {exc}", code="internal") from exc


def _process_from_json(item: dict[str, Any]) -> SnapshotProcess:
    config = item.get("config") or {}
    return SnapshotProcess(
        config=ProcessConfig(
            cmd=config.get("cmd", ""),
            args=list(config.get("args") or []),
            cwd=config.get("cwd") or None,
            envs=dict(config.get("envs") or {}),
        ),
        pid=int(item.get("pid", 0)),
        tag=item.get("tag") or None,
    )


class ConnectEnvdClient:
    """Implements ``shared.ports.envd.Envd`` and ``EnvdTelemetry``."""

    def __init__(self, http: httpx.AsyncClient | None = None) -> None:
        self._http = http or httpx.AsyncClient(http2=False, follow_redirects=False)
        self._owns_http = http is None

    async def list_processes(
        self, endpoint: Endpoint, *, access_token: str | None, timeout: float = 10.0
    ) -> list[SnapshotProcess]:
        headers = _headers(access_token, streaming=False)
        headers["Connect-Timeout-Ms"] = _deadline_ms(timeout)
        try:
            response = await self._http.post(
                f"{endpoint.base_url}/process.Process/List",
                content=b"{}",
                headers=headers,
                timeout=timeout,
            )
        except httpx.TransportError as exc:
            raise _unreachable(endpoint, exc) from exc
        if response.status_code != 200:
            raise _error_from_body(response.status_code, response.content)
        try:
            data = response.json()
            return [_process_from_json(item) for item in data.get("processes") or []]
        except (ValueError, TypeError, AttributeError) as exc:
            raise EnvdError(f"envd sent an unreadable List reply: {exc}", code="internal") from exc

    async def start_process(
        self,
        endpoint: Endpoint,
        config: ProcessConfig,
        *,
        tag: str | None,
        access_token: str | None,
        timeout: float = 10.0,
    ) -> int:
        request: dict[str, Any] = {"process": _process_json(config), "stdin": False}
        if tag:
            request["tag"] = tag
        headers = _headers(access_token, streaming=True)
        response = await self._start(endpoint, request, headers, timeout)
        async with _reading(endpoint, response):
            if response.status_code != 200:
                raise _error_from_body(response.status_code, await response.aread())
            message = await _first_message(response)
        try:
            pid = int(message["event"]["start"]["pid"])
        except (KeyError, TypeError, ValueError) as exc:
            raise EnvdError(f"expected a start event, got {message!r}", code="internal") from exc
        log.info("envd_process_started", host=endpoint.host, pid=pid, cmd=config.cmd, tag=tag)
        return pid

    async def run_command(
        self,
        endpoint: Endpoint,
        command: str,
        *,
        user: str,
        timeout: float,
        access_token: str | None,
        envs: dict[str, str] | None = None,
    ) -> CommandResult:
        process: dict[str, Any] = {"cmd": "/bin/bash", "args": ["-l", "-c", command]}
        if envs:
            process["envs"] = dict(envs)
        headers = _headers(access_token, streaming=True)
        # The daemon turns Connect-Timeout-Ms into the process's deadline (it kills it there).
        headers["Connect-Timeout-Ms"] = _deadline_ms(timeout)
        headers["Authorization"] = _basic(user)
        request = {"process": process, "stdin": False}
        response = await self._start(endpoint, request, headers, timeout + _COMMAND_GRACE)
        output = bytearray()
        started = time.monotonic()
        async with _reading(endpoint, response):
            try:
                if response.status_code != 200:
                    raise _error_from_body(response.status_code, await response.aread())
                async for data in _messages(response):
                    event = data.get("event") or {}
                    chunk = (event.get("data") or {}) if isinstance(event, dict) else {}
                    for stream in ("stdout", "stderr", "pty"):
                        if isinstance(chunk.get(stream), str):
                            output += base64.b64decode(chunk[stream])
                            del output[:-COMMAND_OUTPUT_TAIL]
                    end = event.get("end") if isinstance(event, dict) else None
                    if isinstance(end, dict):
                        exited = bool(end.get("exited", False))
                        return CommandResult(
                            exit_code=int(end.get("exitCode", 0)) if exited else None,
                            output=output.decode("utf-8", "replace"),
                            timed_out=not exited and time.monotonic() - started >= timeout,
                        )
            except EnvdError as exc:
                if exc.code == "deadline_exceeded":
                    return CommandResult(
                        exit_code=None, output=output.decode("utf-8", "replace"), timed_out=True
                    )
                raise
            except httpx.TimeoutException:
                return CommandResult(
                    exit_code=None, output=output.decode("utf-8", "replace"), timed_out=True
                )
        raise _no_end()

    async def run(
        self,
        endpoint: Endpoint,
        config: ProcessConfig,
        *,
        user: str,
        access_token: str | None,
        on_output: Callable[[str], Awaitable[None]],
        timeout: float,
    ) -> int:
        """Run a command to its end as ``user``, handing each line of its output (stdout and
        stderr, as they come) to ``on_output``; its exit code. ``EnvdError`` with code
        ``deadline_exceeded`` after ``timeout`` seconds, ``unauthenticated`` for an unknown
        user (as E2B's envd)."""
        headers = _headers(access_token, streaming=True)
        headers["Authorization"] = _basic(user)
        headers["Connect-Timeout-Ms"] = _deadline_ms(timeout)
        request = {"process": _process_json(config), "stdin": False}
        response = await self._start(
            endpoint, request, headers, httpx.Timeout(10.0, read=timeout + 10)
        )
        partial = {"stdout": b"", "stderr": b""}
        async with _reading(endpoint, response):
            if response.status_code != 200:
                raise _error_from_body(response.status_code, await response.aread())
            async for message in _messages(response):
                event = message.get("event") or {}
                if "data" in event:
                    for stream, chunk in (event["data"] or {}).items():
                        if stream not in partial:
                            continue
                        partial[stream] += base64.b64decode(chunk)
                        *lines, partial[stream] = partial[stream].split(b"\n")
                        for line in lines:
                            await on_output(line.decode(errors="replace"))
                elif "end" in event:
                    for rest in partial.values():
                        if rest:
                            await on_output(rest.decode(errors="replace"))
                    end = event["end"] or {}
                    # proto3 JSON leaves a zero exit code out
                    return int(end.get("exitCode", end.get("exit_code", 0)))
        raise _no_end()

    async def activity(
        self, endpoint: Endpoint, *, access_token: str | None, timeout: float = 2.0
    ) -> InnerActivity:
        response = await self._get(endpoint, "/activity", None, access_token, timeout)
        try:
            data = response.json()
            last = data["last"]
            return InnerActivity(
                now=_unix(data["now"]),
                last={str(k): _unix(v) if v is not None else None for k, v in last.items()},
            )
        except (ValueError, TypeError, KeyError, AttributeError, OverflowError, OSError) as exc:
            raise EnvdError(f"envd sent an unreadable activity: {exc}", code="internal") from exc

    async def metrics(
        self,
        endpoint: Endpoint,
        *,
        access_token: str | None,
        start: int | None,
        end: int | None,
        timeout: float = 5.0,
    ) -> list[MetricSample]:
        params = {k: str(v) for k, v in (("start", start), ("end", end)) if v is not None}
        response = await self._get(endpoint, "/metrics", params, access_token, timeout)
        return _listed(response, "/metrics", MetricSample, "unreadable metrics")

    async def logs(
        self,
        endpoint: Endpoint,
        *,
        access_token: str | None,
        cursor_ms: int | None,
        limit: int,
        backward: bool,
        level: str | None,
        search: str | None,
        timeout: float = 5.0,
    ) -> list[LogEntry]:
        params = {"limit": str(limit), "direction": "backward" if backward else "forward"}
        if cursor_ms is not None:
            params["cursor"] = str(cursor_ms)
        if level:
            params["level"] = level
        if search is not None:
            params["search"] = search
        response = await self._get(endpoint, "/logs", params, access_token, timeout)
        return _listed(response, "/logs", LogEntry, "an unreadable log")

    async def _start(
        self,
        endpoint: Endpoint,
        request: dict[str, Any],
        headers: dict[str, str],
        timeout: float | httpx.Timeout,
    ) -> httpx.Response:
        """``process.Process/Start``'s response, its stream not yet read (the caller closes it)."""
        http_request = self._http.build_request(
            "POST",
            f"{endpoint.base_url}/process.Process/Start",
            content=_envelope(request),
            headers=headers,
            timeout=timeout,
        )
        try:
            return await self._http.send(http_request, stream=True)
        except httpx.TransportError as exc:
            raise _unreachable(endpoint, exc) from exc

    async def _get(
        self,
        endpoint: Endpoint,
        path: str,
        params: dict[str, str] | None,
        access_token: str | None,
        timeout: float,
    ) -> httpx.Response:
        """A 200 answer to ``GET path`` (an HTTP route of envd, not a Connect call)."""
        headers = {"X-Access-Token": access_token} if access_token else {}
        try:
            response = await self._http.get(
                f"{endpoint.base_url}{path}", params=params, headers=headers, timeout=timeout
            )
        except httpx.TransportError as exc:
            raise _unreachable(endpoint, exc) from exc
        if response.status_code != 200:
            raise _error_from_body(response.status_code, response.content[:4096])
        return response

    async def upload_file(
        self,
        endpoint: Endpoint,
        path: str,
        source: Path,
        *,
        user: str,
        access_token: str | None,
        timeout: float = 600.0,
    ) -> None:
        """Write ``source`` (a local file) to ``path`` in the pod as ``user`` (envd's
        ``POST /files``, streamed)."""

        async def chunks() -> AsyncIterator[bytes]:
            f = await asyncio.to_thread(source.open, "rb")
            try:
                while chunk := await asyncio.to_thread(f.read, _FILE_CHUNK):
                    yield chunk
            finally:
                f.close()

        headers = {"Content-Type": "application/octet-stream"}
        if access_token:
            headers["X-Access-Token"] = access_token
        try:
            response = await self._http.post(
                f"{endpoint.base_url}/files",
                params={"path": path, "username": user},
                content=chunks(),
                headers=headers,
                timeout=httpx.Timeout(10.0, read=timeout, write=timeout),
            )
        except httpx.TransportError as exc:
            raise _unreachable(endpoint, exc) from exc
        if not response.is_success:
            raise _error_from_body(response.status_code, response.content[:4096])

    async def download_file(
        self,
        endpoint: Endpoint,
        path: str,
        dest: Path,
        *,
        user: str,
        access_token: str | None,
        max_bytes: int,
        timeout: float = 600.0,
    ) -> int:
        """Copy ``path`` in the pod to ``dest`` (local); its size. ``EnvdError`` with code
        ``too_large`` past ``max_bytes`` (what a pod hands back is bounded)."""
        headers = {"X-Access-Token": access_token} if access_token else {}
        size = 0
        try:
            async with self._http.stream(
                "GET",
                f"{endpoint.base_url}/files",
                params={"path": path, "username": user},
                headers=headers,
                timeout=httpx.Timeout(10.0, read=timeout),
            ) as response:
                if response.status_code != 200:
                    raise _error_from_body(response.status_code, await response.aread())
                f = await asyncio.to_thread(dest.open, "wb")
                try:
                    async for chunk in response.aiter_bytes(_FILE_CHUNK):
                        size += len(chunk)
                        if size > max_bytes:
                            raise EnvdError(
                                f"{path} is larger than {max_bytes} bytes", code="too_large"
                            )
                        await asyncio.to_thread(f.write, chunk)
                finally:
                    f.close()
        except httpx.TransportError as exc:
            raise _unreachable(endpoint, exc) from exc
        return size

    async def health(self, endpoint: Endpoint, *, timeout: float = 2.0) -> bool:
        try:
            response = await self._http.get(f"{endpoint.base_url}/health", timeout=timeout)
        except httpx.TransportError:
            return False
        return response.is_success

    async def close(self) -> None:
        if self._owns_http:
            await self._http.aclose()


def _unix(value: object) -> datetime:
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"not a unix time: {value!r}")
    return datetime.fromtimestamp(float(value), UTC)


async def _frames(response: httpx.Response) -> AsyncGenerator[tuple[bool, object], None]:
    """Each enveloped message of a Connect stream, checked and parsed: whether it ends the
    stream, and its JSON."""
    buffer = b""
    async for chunk in response.aiter_bytes():
        buffer += chunk
        while len(buffer) >= _ENVELOPE.size:
            flags, length = _ENVELOPE.unpack_from(buffer)
            if length > MAX_MESSAGE_BYTES:
                raise EnvdError(f"envd message of {length} bytes is too large", code="internal")
            if len(buffer) < _ENVELOPE.size + length:
                break
            payload = buffer[_ENVELOPE.size : _ENVELOPE.size + length]
            buffer = buffer[_ENVELOPE.size + length :]
            if flags & _COMPRESSED:
                raise EnvdError("envd sent a compressed message", code="internal")
            try:
                data = json.loads(payload or b"{}")
            except ValueError as exc:
                raise EnvdError(f"envd sent invalid JSON: {exc}", code="internal") from exc
            yield bool(flags & _END_STREAM), data


def _raise_stream_error(end: object) -> None:
    """The error an end-stream message carries, if any, raised."""
    error = end.get("error") if isinstance(end, dict) else None
    if isinstance(error, dict):
        code = str(error.get("code", "unknown"))
        if code == "unavailable":
            raise EnvdUnavailable(f"envd unavailable: {error.get('message', '')}")
        raise EnvdError(f"envd error {code}: {error.get('message', '')}", code=code)


def _object(data: object) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise EnvdError(f"envd sent a non-object message: {data!r}", code="internal")
    return data


async def _messages(response: httpx.Response) -> AsyncIterator[dict[str, Any]]:
    """Every enveloped message of a Connect stream; an end-stream error becomes EnvdError."""
    async for end, data in _frames(response):
        message = _object(data)
        if end:
            _raise_stream_error(message)
            return
        yield message


async def _first_message(response: httpx.Response) -> dict[str, Any]:
    """The first enveloped message of a Connect stream; an end-stream error becomes EnvdError."""
    async with contextlib.aclosing(_frames(response)) as frames:
        async for end, data in frames:
            if end:
                _raise_stream_error(data)
                raise EnvdError("envd ended the stream before the start event", code="internal")
            return _object(data)
    raise EnvdError("envd closed the stream before the start event", code="internal")
