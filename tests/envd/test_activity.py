"""The daemon's activity signals (``services.envd.activity``), on this machine's real /proc and
files: output, CPU use of the processes (not the daemon's own), outbound connections (inbound
ones and loopback do not count) and the keep-alive file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from services.envd.activity import Activity, outbound_connections

# /proc/net/tcp lines: a listener on :8080, a connection *to* it (inbound), one to 10.0.0.7:443
# from an ephemeral port (outbound), and one to 127.0.0.1:5432 (loopback: not counted).
HEADER = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid\n"
LISTEN = "   0: 0A00020A:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000\n"
INBOUND = "   1: 0A00020A:1F90 0100A8C0:C350 01 00000000:00000000 00:00000000 00000000  1000\n"
OUTBOUND = "   2: 0A00020A:9C40 0700000A:01BB 01 00000000:00000000 00:00000000 00000000  1000\n"
LOOPBACK = "   3: 0100007F:9C41 0100007F:1538 01 00000000:00000000 00:00000000 00000000  1000\n"


@pytest.mark.unit
def test_only_outbound_connections_to_other_hosts_count(tmp_path: Path) -> None:
    table = tmp_path / "tcp"
    table.write_text(HEADER + LISTEN + INBOUND + LOOPBACK)
    assert outbound_connections((str(table),)) == 0
    table.write_text(HEADER + LISTEN + INBOUND + LOOPBACK + OUTBOUND)
    assert outbound_connections((str(table),)) == 1
    table.write_text(HEADER + "garbage\n   9: zz:zz yy:yy 01\n")
    assert outbound_connections((str(table), str(tmp_path / "missing"))) == 0


@pytest.mark.unit
def test_keepalive_file_and_endpoint(tmp_path: Path) -> None:
    marker = tmp_path / "keepalive"
    activity = Activity(keepalive_file=str(marker))
    assert activity.report()["last"]["keepalive"] is None
    marker.touch()
    assert activity.report()["last"]["keepalive"] == pytest.approx(marker.stat().st_mtime)
    activity.kept_alive()
    assert activity.report()["last"]["keepalive"] >= marker.stat().st_mtime


# Run as its own process, like the daemon: the sampler counts every descendant of the process it
# runs in, and pytest's own children (session nats-server, the real node's kubelet and apiserver)
# are busy whenever the rest of the suite is.
SAMPLER = """
import subprocess, sys, time
from services.envd.activity import Activity

activity = Activity()
idle = subprocess.Popen(["sleep", "30"])
activity.sample_cpu()
time.sleep(0.5)
activity.sample_cpu()
print("idle", activity.cpu is None, flush=True)
idle.kill()
idle.wait()
burn = "import time\\nend = time.process_time() + 0.4\\nwhile time.process_time() < end: pass\\n"
busy = subprocess.Popen([sys.executable, "-c", burn + "time.sleep(30)"])
activity.sample_cpu()
deadline = time.monotonic() + 30
while activity.cpu is None and time.monotonic() < deadline:
    time.sleep(0.5)
    activity.sample_cpu()
print("busy", activity.cpu is not None, flush=True)
busy.kill()
busy.wait()
"""


def test_cpu_counts_a_busy_child_not_an_idle_one() -> None:
    out = subprocess.run(
        [sys.executable, "-c", SAMPLER],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
        cwd=Path(__file__).resolve().parents[2],
    ).stdout.split()
    assert out == ["idle", "True", "busy", "True"]
