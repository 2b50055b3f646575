"""``python -m services.envd --listen HOST:PORT [--access-token T] [--root DIR]``.

The listening socket is bound before the heavy imports (uvicorn, connectrpc, protobuf), so a
client that connects during start-up waits in the backlog instead of being refused; ``/health``
answers once the whole API can be served (the Connect services are loaded before the server
starts: "ready" is what a resume's replay needs, not just an HTTP answer).
The daemon imports nothing from ``shared``.

``--precompile`` writes bytecode for everything the daemon loads and exits: a daemon started from
a read-only tree (a sandbox image, the local runtime's bubblewrap binds) cannot cache what it
compiles, and compiling uvicorn, connectrpc and protobuf from source is most of a cold start.
"""

from __future__ import annotations

import argparse
import gc
import os
import socket
import sys

from services.envd.reach import enter_domain


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="envd", description="torpor's in-sandbox daemon (envd-compatible)"
    )
    parser.add_argument("--listen", default="0.0.0.0:49983", help="HOST:PORT (default %(default)s)")
    parser.add_argument(
        "--access-token",
        default=os.environ.get("ENVD_ACCESS_TOKEN") or None,
        help="require this X-Access-Token (default: $ENVD_ACCESS_TOKEN, none when unset)",
    )
    parser.add_argument(
        "--root",
        default=None,
        help="directory relative paths and the default cwd resolve against (default: $HOME)",
    )
    parser.add_argument(
        "--sudo-socket",
        default=None,
        help="serve the sandbox's sudo shim on this unix socket (inside a sandbox only)",
    )
    parser.add_argument(
        "--kept-root",
        default="/",
        help="where home/user and workspace of /kept-files are (default %(default)s; tests)",
    )
    parser.add_argument("--log-level", default="warning")
    parser.add_argument(
        "--precompile",
        action="store_true",
        help="write bytecode for every module the daemon loads, then exit (run where writable)",
    )
    return parser.parse_args(argv)


def _split_listen(listen: str) -> tuple[str, int]:
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"envd: --listen must be HOST:PORT, got {listen!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # proto=IPPROTO_TCP matters: asyncio only sets TCP_NODELAY on accepted sockets whose proto
    # says TCP, and without it a response written in two parts waits ~40 ms (Nagle+delayed ACK).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(1024)
    sock.set_inheritable(False)
    return sock


def load_closure() -> None:
    """Import everything the daemon loads to serve (what ``--precompile`` compiles, and what the
    local runtime's copy of its interpreter holds: shared/runtime/local/daemon_python.py)."""
    from services.envd.app import EnvdApp
    from services.envd.server import _server

    app = EnvdApp(root=os.getcwd(), access_token=None)
    try:
        _ = app.connect_apps  # the lazily loaded part
        _server(app, "warning").config.load()  # the protocol classes uvicorn imports at start
    finally:
        app.close()


def precompile() -> int:
    """Byte-compile the daemon's import closure next to the sources (or under
    ``PYTHONPYCACHEPREFIX``), whatever ``PYTHONDONTWRITEBYTECODE`` says; fresh files are kept."""
    import py_compile

    load_closure()
    written = 0
    for module in list(sys.modules.values()):
        spec = getattr(module, "__spec__", None)
        source, cached = getattr(spec, "origin", None), getattr(spec, "cached", None)
        if not source or not cached or not source.endswith(".py"):
            continue
        try:
            if os.path.exists(cached) and os.stat(cached).st_mtime >= os.stat(source).st_mtime:
                continue
            py_compile.compile(source, cfile=cached, doraise=True)
            written += 1
        except (OSError, py_compile.PyCompileError) as exc:
            print(f"envd: cannot precompile {source}: {exc}", file=sys.stderr)
    print(f"envd: precompiled {written} modules")
    return 0


def main(argv: list[str] | None = None) -> int:
    # Before any sandbox code runs (services/envd/reach.py: the one place of the domain rule).
    enter_domain("envd", undumpable=True)
    gc.disable()  # until start-up is done (services.envd.server.serve): a few % of it
    args = parse_args(argv)
    # Read once (parse_args' default); processes the daemon starts must not inherit the token.
    os.environ.pop("ENVD_ACCESS_TOKEN", None)
    from services.envd.startup import Startup

    startup = Startup.take_from_environ()  # a built template's start and ready commands
    if args.precompile:
        return precompile()
    host, port = _split_listen(args.listen)
    root = os.path.abspath(args.root or os.environ.get("HOME") or os.getcwd())
    if not os.path.isdir(root):
        print(f"envd: --root {root} is not a directory", file=sys.stderr)
        return 2
    try:
        sock = _bind(host, port)
    except OSError as exc:
        print(f"envd: cannot listen on {host}:{port}: {exc}", file=sys.stderr)
        return 1
    from services.envd.server import serve

    return serve(
        sock,
        root=root,
        access_token=args.access_token,
        log_level=args.log_level,
        sudo_socket=args.sudo_socket,
        startup=startup,
        kept_root=os.path.abspath(args.kept_root),
    )


if __name__ == "__main__":
    raise SystemExit(main())
