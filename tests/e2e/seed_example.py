"""The seed's Python example, verbatim, plus the prints a test can check. Run with
E2B_API_KEY / E2B_API_URL / E2B_SANDBOX_URL pointing at torpor; prints one JSON line at the end."""

import base64
import json
import os
import sys
import time

import httpx

SERVER_PY = """\
import os, time, uuid
print(f"server.py started pid={os.getpid()} boot={uuid.uuid4().hex}", flush=True)
while True:
    time.sleep(3600)
"""

# --- setup the seed assumes: the app exists in /workspace (kept on the workspace volume)
from e2b import Sandbox  # noqa: E402

# ---------------------------------------------------------------- seed, verbatim
sbx = Sandbox.create(
    template="sandbox-base",
    timeout=5 * 60,  # pause after 5 minutes of no activity
    lifecycle={"on_timeout": "pause", "auto_resume": True},
)
sbx.files.write("/workspace/server.py", SERVER_PY)

# a long-running background process — its command line gets captured on pause
sbx.commands.run(
    "PYTHONPATH=/workspace/pylibs PATH=/workspace/npm/bin:$PATH python3 server.py > service.log 2>&1",
    background=True,
    timeout=0,
    cwd="/workspace",
)

print(sbx.sandbox_id, "is running")
# ----------------------------------------------------------------


def first_log_line(s: Sandbox) -> str:
    for _ in range(100):
        out = s.commands.run("cat service.log || true", cwd="/workspace").stdout.strip()
        if out:
            return out
        time.sleep(0.1)
    raise SystemExit("service.log stayed empty")


before = first_log_line(sbx)

# "or call pause api" — the seed's curl, as httpx
r = httpx.post(
    f"{os.environ['E2B_API_URL']}/api/v1/sandbox/pause/{sbx.sandbox_id}",
    headers={"Authorization": f"Bearer {os.environ['E2B_API_KEY']}"},
    timeout=120,
)
print("pause", r.status_code, file=sys.stderr)

# ---------------------------------------------------------------- seed, verbatim
info = sbx.get_info()
print(info.metadata["snapshot"])

snapshot = json.loads(base64.b64decode(info.metadata["snapshot"]))
print(json.dumps(snapshot, indent=2))

# ... later, possibly from a different process ...
sbx = Sandbox.connect(sbx.sandbox_id)  # transparently resumes if paused
result = sbx.commands.run("tail service.log", cwd="/workspace")
# ----------------------------------------------------------------

after = result.stdout.strip()
for _ in range(50):  # the replayed process may not have written its line yet
    if after:
        break
    time.sleep(0.1)
    after = sbx.commands.run("tail service.log", cwd="/workspace").stdout.strip()
info_after = sbx.get_info()
print(
    json.dumps(
        {
            "sandbox_id": sbx.sandbox_id,
            "pause_status": r.status_code,
            "state_at_pause": info.state.value,
            "snapshot": snapshot,
            "before": before,
            "after": after,
            "state_after": info_after.state.value,
            "snapshot_after": info_after.metadata.get("snapshot") == info.metadata["snapshot"],
        }
    )
)
