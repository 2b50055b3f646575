"""A pod of torpor's shape whose process counts in memory: for checkpoint tests and benchmarks.

bwrap is PID 1 in the pod's user, PID, mount, IPC and UTS namespaces, on the idmapped overlay
root, in the pod network; its process keeps a count and a secret in memory only (plus ``MIB``
MiB of touched ballast) and serves ``<count> <secret> <pid>`` on the daemon's address (so
``/health`` answers too). Not the daemon: the daemon enters a Landlock domain, and CRIU's
parasite cannot connect its abstract transport socket from inside one (docs/memory-pause.md).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from shared.ports.workloads import Endpoint

TEMPLATE = "checkpoint-counter"
COUNTER = """
import http.server, os, sys, threading, time
secret = os.urandom(8).hex(); state = [0]
ballast = bytearray(int(os.environ.get("MIB", "0")) * 2**20)
for i in range(0, len(ballast), 4096):
    ballast[i] = 1
def count():
    while True:
        state[0] += 1; time.sleep(0.05)
threading.Thread(target=count, daemon=True).start()
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("%d %s %d" % (state[0], secret, os.getpid())).encode()
        self.send_response(200); self.end_headers(); self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[2])), Answer).serve_forever()
"""


def write_template(folder: Path, *, mib: int = 0) -> Path:
    """A templates folder holding the counter pod's template; pass it as ``templates_dir``."""
    folder.mkdir(parents=True)
    command = json.dumps(["/usr/bin/python3", "-c", COUNTER, "{host}", "{port}"])
    env = json.dumps({"MIB": str(mib)})
    (folder / f"{TEMPLATE}.yaml").write_text(f"name: {TEMPLATE}\ncommand: {command}\nenv: {env}\n")
    return folder


async def ask(ep: Endpoint) -> tuple[int, str, int]:
    """(count, secret, pid inside) of the counter pod at ``ep``."""
    async with httpx.AsyncClient(trust_env=False, timeout=5) as client:
        r = await client.get(f"{ep.base_url}/count")
    count, secret, pid = r.text.split()
    return int(count), secret, int(pid)
