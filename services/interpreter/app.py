"""The HTTP routes of the execution server (E2B's ``template/server`` wire format):

- ``GET /health`` -> ``"OK"`` once the default python context is up
- ``POST /execute`` ``{"code", "context_id"?, "language"?, "env_vars"?}`` -> JSON lines
- ``POST /contexts`` ``{"language"?, "cwd"?}`` -> ``{"id", "language", "cwd"}``
- ``GET /contexts`` -> those, oldest first
- ``POST /contexts/{id}/restart``, ``DELETE /contexts/{id}``

Refusals are plain text with a 4xx status (the SDKs show the text): unknown fields, wrong
types, both ``context_id`` and ``language``, an unknown language or context, a body over
``MAX_BODY``."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from services.interpreter import outputs
from services.interpreter.contexts import ContextError, GlobalEnv
from services.interpreter.languages import BadRequest, check_cwd, check_env, language
from services.interpreter.registry import Contexts

log = logging.getLogger("interpreter")
MAX_BODY = 16 * 1024 * 1024
DRAIN_LIMIT = 64 * 1024 * 1024
EXECUTE_FIELDS = {"code", "context_id", "language", "env_vars"}
CONTEXT_FIELDS = {"language", "cwd"}


class TooLarge(BadRequest):
    """A body over MAX_BODY (413)."""


async def _body(request: Request, allowed: set[str]) -> dict[str, Any]:
    # An oversized body is read to its end (up to DRAIN_LIMIT) and dropped, so the client gets
    # the 413 instead of a connection reset in the middle of its upload.
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > DRAIN_LIMIT:
            break
        if size <= MAX_BODY:
            chunks.append(chunk)
    if size > MAX_BODY:
        raise TooLarge(f"request body over {MAX_BODY} bytes")
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        raise BadRequest("the body is not JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    unknown = sorted(set(body) - allowed)
    if unknown:
        shown = ", ".join(repr(str(k)[:40]) for k in unknown[:5])
        raise BadRequest(f"unknown field(s) {shown}: not supported by this server")
    return {k: v for k, v in body.items() if v is not None}


def _status(e: BadRequest) -> int:
    return 413 if isinstance(e, TooLarge) else 400


def build_app(global_env: GlobalEnv, *, home: str, start_languages: tuple[str, ...]) -> Starlette:
    contexts = Contexts(global_env, home)

    @asynccontextmanager
    async def lifespan(_: Starlette) -> AsyncIterator[None]:
        # python's default context must start; the others only if their kernel is there.
        made = await asyncio.gather(
            *(contexts.default(language(name)) for name in start_languages),
            return_exceptions=True,
        )
        for name, outcome in zip(start_languages, made, strict=True):
            if isinstance(outcome, BaseException):
                if name == "python":
                    raise outcome
                log.warning("no default %s context: %s", name, outcome)
        try:
            yield
        finally:
            await contexts.close()

    async def health(_: Request) -> Response:
        return JSONResponse("OK")

    async def execute(request: Request) -> Response:
        try:
            body = await _body(request, EXECUTE_FIELDS)
            code = body.get("code")
            if not isinstance(code, str):
                raise BadRequest("code must be a string")
            env = check_env(body.get("env_vars"))
            context_id = body.get("context_id")
            if context_id is not None and "language" in body:
                raise BadRequest("Only one of context_id or language can be provided")
            if context_id is not None:
                if not isinstance(context_id, str):
                    raise BadRequest("context_id must be a string")
                context = contexts.get(context_id)
                if context is None:
                    return PlainTextResponse(f"Context {context_id[:80]} not found", 404)
            else:
                lang = body.get("language")
                if lang is not None and not isinstance(lang, str):
                    raise BadRequest("language must be a string")
                context = await contexts.default(language(lang))
        except BadRequest as e:
            return PlainTextResponse(str(e), _status(e))
        except ContextError as e:
            return PlainTextResponse(str(e), 500)
        token = request.headers.get("x-access-token")

        async def lines() -> AsyncIterator[bytes]:
            async for item in context.run(code, env, token):
                yield outputs.line(item)
            yield outputs.line(outputs.END)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def create_context(request: Request) -> Response:
        try:
            body = await _body(request, CONTEXT_FIELDS)
            lang = body.get("language")
            if lang is not None and not isinstance(lang, str):
                raise BadRequest("language must be a string")
            chosen = language(lang)
            cwd = check_cwd(body.get("cwd", home))
            context = await contexts.create(chosen, cwd)
        except BadRequest as e:
            return PlainTextResponse(str(e), _status(e))
        except ContextError as e:
            return PlainTextResponse(str(e), 500)
        return JSONResponse(context.describe())

    async def list_contexts(_: Request) -> Response:
        return JSONResponse([c.describe() for c in contexts.all()])

    async def restart_context(request: Request) -> Response:
        context = contexts.get(request.path_params["context_id"])
        if context is None:
            return PlainTextResponse("Context not found", 404)
        try:
            await context.restart()
        except ContextError as e:
            return PlainTextResponse(str(e), 500)
        return JSONResponse(None)

    async def remove_context(request: Request) -> Response:
        if not await contexts.remove(request.path_params["context_id"]):
            return PlainTextResponse("Context not found", 404)
        return JSONResponse(None)

    return Starlette(
        routes=[
            Route("/health", health, methods=["GET"]),
            Route("/execute", execute, methods=["POST"]),
            Route("/contexts", create_context, methods=["POST"]),
            Route("/contexts", list_contexts, methods=["GET"]),
            Route("/contexts/{context_id}/restart", restart_context, methods=["POST"]),
            Route("/contexts/{context_id}", remove_context, methods=["DELETE"]),
        ],
        lifespan=lifespan,
    )
