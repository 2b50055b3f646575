"""Jupyter messages (jupyter_client's dicts) as the JSON lines the E2B SDKs parse.

One line per output: ``{"type": "stdout"|"stderr", "text", "timestamp"}``, ``{"type": "result",
"text", "html", ..., "chart", "data", "extra", "is_main_result"}``, ``{"type": "error", "name",
"value", "traceback"}``, ``{"type": "number_of_executions", "execution_count"}``; the stream
ends with ``{"type": "end_of_execution"}``. Pure functions, no I/O."""

from __future__ import annotations

import datetime
import json
from typing import Any

Output = dict[str, Any]

# MIME type -> the SDK's Result field.
MIME_FIELDS = {
    "text/plain": "text",
    "text/html": "html",
    "text/markdown": "markdown",
    "image/svg+xml": "svg",
    "image/png": "png",
    "image/jpeg": "jpeg",
    "application/pdf": "pdf",
    "text/latex": "latex",
    "application/json": "json",
    "application/javascript": "javascript",
    "e2b/data": "data",
    "e2b/chart": "chart",
}
END = {"type": "end_of_execution"}
KEEPALIVE = {"type": "keepalive"}


def result(bundle: dict[str, Any], *, main: bool) -> Output:
    """A display's or the cell's value, every MIME type of its bundle kept (unknown ones in
    ``extra``)."""
    out: Output = {"type": "result", "is_main_result": main}
    extra: dict[str, Any] = {}
    for mime, value in bundle.items():
        field = MIME_FIELDS.get(mime)
        if field is None:
            extra[mime] = value
        elif value is not None:
            out[field] = value
    text = out.get("text")
    # A string's repr shows as the string (E2B's SDKs strip the quotes too).
    if isinstance(text, str) and len(text) >= 2 and text[0] == text[-1] and text[0] in "'\"":
        out["text"] = text[1:-1]
    out["extra"] = extra
    return out


def stream(name: str, text: str, when: object) -> Output:
    return {"type": name, "text": text, "timestamp": timestamp(when)}


def error(name: str, value: str, traceback: list[str] | str) -> Output:
    lines = traceback if isinstance(traceback, str) else "\n".join(traceback)
    return {"type": "error", "name": name, "value": value, "traceback": lines}


def count(execution_count: int) -> Output:
    return {"type": "number_of_executions", "execution_count": execution_count}


def timestamp(when: object) -> str:
    if isinstance(when, datetime.datetime):
        return when.isoformat()
    if isinstance(when, str):
        return when
    return datetime.datetime.now(datetime.UTC).isoformat()


def line(output: Output) -> bytes:
    return json.dumps(output, default=str, separators=(",", ":")).encode() + b"\n"


def from_iopub(msg: dict[str, Any]) -> Output | None:
    """The output an IOPub message carries, if any (status and input are handled by the
    caller: they drive the execution, they are not outputs)."""
    kind = msg.get("msg_type") or msg.get("header", {}).get("msg_type")
    content = msg.get("content", {})
    if kind == "stream":
        name = "stderr" if content.get("name") == "stderr" else "stdout"
        return stream(name, str(content.get("text", "")), msg.get("header", {}).get("date"))
    if kind == "display_data":
        return result(dict(content.get("data", {})), main=False)
    if kind == "execute_result":
        return result(dict(content.get("data", {})), main=True)
    if kind == "error":
        return error(
            str(content.get("ename", "")),
            str(content.get("evalue", "")),
            list(content.get("traceback", [])),
        )
    return None
