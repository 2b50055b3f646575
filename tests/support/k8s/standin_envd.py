"""Stand-in for ``services.envd`` while it does not exist: answers ``GET /health`` with 204.

Same command line as the real daemon (``--listen host:port --root dir [--access-token t]``).
The kubelet uses it only when ``services/envd/__main__.py`` is missing.
"""

from __future__ import annotations

import argparse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(204 if self.path == "/health" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        return


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--root")
    parser.add_argument("--access-token")
    args = parser.parse_args()
    host, port = args.listen.rsplit(":", 1)
    ThreadingHTTPServer((host, int(port)), _Health).serve_forever()


if __name__ == "__main__":
    main()
