"""``python -m services.interpreter [--listen HOST:PORT] [--envd URL] [--home DIR]``: the execution
server of code-interpreter-v1 (inside the sandbox, on the template's venv)."""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
import urllib.error
import urllib.request
from types import FrameType

import uvicorn

from services.interpreter.app import build_app
from services.interpreter.contexts import GlobalEnv

ENVD_PORT = 49983
ENVS_TIMEOUT = 5.0


def envd_url() -> str:
    """The in-sandbox daemon listens on the pod's own address (its hostname's)."""
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        address = "127.0.0.1"
    return f"http://{address}:{ENVD_PORT}"


def sandbox_env(base: str) -> GlobalEnv:
    """The sandbox's env vars from the daemon's ``/envs`` (the caller's access token, if the
    sandbox is secured), read in a thread: urllib keeps this server free of HTTP clients."""

    def fetch(token: str | None) -> dict[str, str]:
        request = urllib.request.Request(f"{base}/envs")  # noqa: S310 (http, built here)
        if token:
            request.add_header("X-Access-Token", token)
        with urllib.request.urlopen(request, timeout=ENVS_TIMEOUT) as answer:  # noqa: S310
            found = json.loads(answer.read(1024 * 1024))
        if not isinstance(found, dict):
            return {}
        return {str(k): v for k, v in found.items() if isinstance(v, str)}

    async def read(token: str | None) -> dict[str, str]:
        try:
            return await asyncio.to_thread(fetch, token)
        except (OSError, ValueError, urllib.error.URLError) as e:
            logging.getLogger("interpreter").warning("the daemon's /envs: %s", e)
            return {}

    return read


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.interpreter")
    parser.add_argument("--listen", default="0.0.0.0:49999")
    parser.add_argument("--envd", default=None, help="the daemon's URL (default: the pod's)")
    parser.add_argument("--home", default="/home/user", help="the default contexts' cwd")
    parser.add_argument("--languages", default="python", help="default contexts made at start")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    if not host or not port.isdigit():
        print(f"interpreter: --listen must be HOST:PORT, not {args.listen!r}", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    app = build_app(
        sandbox_env(args.envd or envd_url()),
        home=args.home,
        start_languages=tuple(x for x in args.languages.split(",") if x),
    )
    config = uvicorn.Config(
        app,
        host=host,
        port=int(port),
        log_level="warning",
        access_log=False,
        timeout_keep_alive=640,
        lifespan="on",
    )
    _AbruptServer(config).run()
    return 0


class _AbruptServer(uvicorn.Server):
    """SIGTERM/SIGINT end the process at once, as a sandbox being killed does: a graceful
    shutdown would finish every running execution's stream with a clean end, and the SDK would
    take that for a normal result instead of raising "the sandbox was killed". The kernels die
    with the process (their parent-death signal)."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        os._exit(128 + sig)


if __name__ == "__main__":
    sys.exit(main())
