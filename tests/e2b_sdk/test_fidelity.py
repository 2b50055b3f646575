"""E2B fidelity through the unmodified SDK against a real stack: what E2B's own SDK suite expects
of envd 0.6.4 (file metadata, watch entries, remove of a missing path, deadline_exceeded, a
killed sandbox breaking its command streams), metrics and logs, list order, ``startedAfter`` and
``set_timeout(0)``; and hostile values for every new input (metrics filters, ``sandbox_ids``,
log queries)."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox, TimeoutException
from e2b.exceptions import NotFoundException

from tests.support.e2b_checks import assert_deadline_times_out, uploaded_entry
from tests.support.pods import daemon_pid
from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sbx(opts: dict[str, object]) -> Iterator[Sandbox]:
    """Alice's sandbox that pauses on timeout."""
    s = Sandbox.create(
        template="base",
        timeout=300,
        lifecycle={"on_timeout": "pause", "auto_resume": False},
        **opts,  # type: ignore[arg-type]
    )
    yield s
    Sandbox.kill(s.sandbox_id, **opts)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def plain(opts: dict[str, object], sbx: Sandbox) -> Iterator[Sandbox]:
    """Alice's second sandbox (killed on timeout), created after ``sbx``."""
    s = Sandbox.create(template="base", timeout=300, **opts)  # type: ignore[arg-type]
    yield s
    Sandbox.kill(s.sandbox_id, **opts)  # type: ignore[arg-type]


def _api(stack: Stack, user: str = "alice") -> httpx.Client:
    return httpx.Client(base_url=stack.api_url, headers={"X-API-KEY": stack.keys[user]}, timeout=30)


# ---------------------------------------------------------------- envd 0.6.x


def test_envd_version_is_064(sbx: Sandbox) -> None:
    assert str(sbx._envd_version) == "0.6.4"


def test_file_metadata(sbx: Sandbox) -> None:
    meta = {"author": "mish", "purpose": "upload"}
    assert sbx.files.write("meta.txt", "x", metadata=meta).metadata == meta
    assert sbx.files.get_info("meta.txt").metadata == meta
    sbx.commands.run("python3 -c \"import os; os.setxattr('meta.txt', 'user.e2b.tag', b'v')\"")
    assert sbx.files.get_info("meta.txt").metadata == {**meta, "tag": "v"}
    assert sbx.files.write("meta.txt", "y").metadata is None
    assert sbx.files.get_info("meta.txt").metadata is None


def test_watch_entry_info_and_upload_sequence(sbx: Sandbox) -> None:
    sbx.files.make_dir("watched")
    handle = sbx.files.watch_dir("watched", include_entry=True, allow_network_mounts=True)
    sbx.files.write("watched/new.txt", "content")
    entry = uploaded_entry(handle.get_new_events(), "new.txt")
    assert entry.path.endswith("/watched/new.txt")
    handle.stop()


def test_remove_of_a_missing_path_succeeds(sbx: Sandbox) -> None:
    sbx.files.remove("never/existed.txt")
    assert not sbx.files.exists("never/existed.txt")


def test_command_deadline_is_a_timeout(sbx: Sandbox) -> None:
    assert_deadline_times_out(sbx, "sleep 30", 2)


# ---------------------------------------------------------------- metrics and logs


def test_metrics_of_a_running_sandbox(sbx: Sandbox) -> None:
    metrics = until(sbx.get_metrics, 30, "a metrics sample")
    m = metrics[0]
    assert m.cpu_count >= 1
    assert 0 <= m.cpu_used_pct <= 100
    assert 0 < m.mem_used <= m.mem_total
    assert 0 < m.disk_used <= m.disk_total
    assert abs(m.timestamp.timestamp() - time.time()) < 3600
    hour_ago = m.timestamp.timestamp() - 3600
    from datetime import UTC, datetime

    assert (
        sbx.get_metrics(
            start=datetime.fromtimestamp(hour_ago - 600, UTC),
            end=datetime.fromtimestamp(hour_ago, UTC),
        )
        == []
    )


def test_metrics_of_many_sandboxes_are_the_callers_only(
    stack: Stack, sbx: Sandbox, plain: Sandbox
) -> None:
    ids = f"{sbx.sandbox_id},{plain.sandbox_id}"
    with _api(stack) as api:
        body = until(
            lambda: (
                (r := api.get("/sandboxes/metrics", params={"sandbox_ids": ids}).json())
                and len(r["sandboxes"]) == 2
                and r
            ),
            30,
            "metrics of both sandboxes",
        )
    assert set(body["sandboxes"]) == {sbx.sandbox_id, plain.sandbox_id}
    assert body["sandboxes"][sbx.sandbox_id]["cpuCount"] >= 1
    with _api(stack, "bob") as bob:
        r = bob.get("/sandboxes/metrics", params={"sandbox_ids": ids})
        assert r.status_code == 200
        assert r.json() == {"sandboxes": {}}
        assert bob.get(f"/sandboxes/{sbx.sandbox_id}/metrics").status_code == 404
        assert bob.get(f"/v2/sandboxes/{sbx.sandbox_id}/logs").status_code == 404


@pytest.mark.parametrize(
    "params",
    [
        {"start": "-1"},
        {"end": "-5"},
        {"start": "abc"},
        {"start": str(10**30)},
        {"end": "1e9"},
        {"start": "--ro-bind"},
        {"start": "1\x00"},
    ],
)
def test_hostile_metric_filters(stack: Stack, sbx: Sandbox, params: dict[str, str]) -> None:
    with _api(stack) as api:
        r = api.get(f"/sandboxes/{sbx.sandbox_id}/metrics", params=params)
    assert r.status_code == 400
    assert next(iter(params)) in r.json()["message"]


@pytest.mark.parametrize(
    "ids",
    [
        "",
        ",".join(f"i{n:019d}" for n in range(101)),
        "a,a",
        "--ro-bind",
        "abc\x00def",
        "x" * 10_000,
    ],
)
def test_hostile_sandbox_ids(stack: Stack, ids: str) -> None:
    with _api(stack) as api:
        r = api.get("/sandboxes/metrics", params={"sandbox_ids": ids})
    assert r.status_code == 400
    assert "sandbox_ids" in r.json()["message"]


_PROBE = r"""
import os, urllib.request, urllib.error
listen = None
for pid in os.listdir("/proc"):
    try:
        args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
    except OSError:
        continue
    if b"--listen" in args:
        listen = args[args.index(b"--listen") + 1].decode()
host, _, port = listen.rpartition(":")
host = "127.0.0.1" if host in ("0.0.0.0", "") else host
for path in ("/metrics", "/logs"):
    try:
        urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=5)
        print(path, 200)
    except urllib.error.HTTPError as e:
        print(path, e.code)
"""


def test_daemon_telemetry_needs_the_token_from_inside(sbx: Sandbox) -> None:
    """Code in the sandbox reaches its daemon's port, but /metrics and /logs, like every other
    daemon route, need the envd access token it does not have."""
    sbx.files.write("probe.py", _PROBE)
    out = sbx.commands.run("python3 probe.py").stdout.split()
    assert out == ["/metrics", "401", "/logs", "401"]


def test_logs_endpoints_shape(stack: Stack, sbx: Sandbox) -> None:
    sbx.commands.run("echo logged")
    with _api(stack) as api:
        v2 = api.get(f"/v2/sandboxes/{sbx.sandbox_id}/logs").json()
        v1 = api.get(f"/sandboxes/{sbx.sandbox_id}/logs", params={"limit": 5}).json()
        errors_only = api.get(
            f"/v2/sandboxes/{sbx.sandbox_id}/logs", params={"level": "error"}
        ).json()
        searched = api.get(
            f"/v2/sandboxes/{sbx.sandbox_id}/logs",
            params={"search": "started pid", "direction": "backward", "limit": 1},
        ).json()
        for params in (
            {"limit": "1001"},
            {"limit": "-1"},
            {"cursor": "-1"},
            {"direction": "sideways"},
            {"level": "fatal"},
            {"search": "x" * 257},
        ):
            r = api.get(f"/v2/sandboxes/{sbx.sandbox_id}/logs", params=params)
            assert r.status_code == 400, params
    assert set(v2) == {"logs"}
    assert v2["logs"], "the daemon logged the command's start"
    assert set(v2["logs"][0]) == {"timestamp", "level", "message", "fields"}
    assert any("started pid" in e["message"] for e in v2["logs"])
    assert set(v1) == {"logs", "logEntries"}
    assert 0 < len(v1["logs"]) <= 5
    assert set(v1["logs"][0]) == {"timestamp", "line"}
    assert all(e["level"] == "error" for e in errors_only["logs"])
    assert len(searched["logs"]) == 1
    assert "started pid" in searched["logs"][0]["message"]


# ---------------------------------------------------------------- list order, startedAfter


def test_list_is_newest_first_and_started_after_is_inclusive(
    stack: Stack, sbx: Sandbox, plain: Sandbox
) -> None:
    with _api(stack) as api:
        listed = api.get("/v2/sandboxes").json()
        ids = [s["sandboxID"] for s in listed]
        assert ids.index(plain.sandbox_id) < ids.index(sbx.sandbox_id)  # newest first
        started = [s["startedAt"] for s in listed]
        assert started == sorted(started, reverse=True)
        asc = [s["sandboxID"] for s in api.get("/v2/sandboxes", params={"order": "asc"}).json()]
        assert asc == list(reversed(ids))
        mine = next(s for s in listed if s["sandboxID"] == plain.sandbox_id)
        after = api.get("/v2/sandboxes", params={"startedAfter": mine["startedAt"]}).json()
        assert plain.sandbox_id in [s["sandboxID"] for s in after]  # at, not only after
        assert sbx.sandbox_id not in [s["sandboxID"] for s in after]
    sdk_ids = [s.sandbox_id for s in Sandbox.list(**_opts(stack)).next_items()]
    assert sdk_ids.index(plain.sandbox_id) < sdk_ids.index(sbx.sandbox_id)


def _opts(stack: Stack) -> dict[str, Any]:
    env = stack.sdk_env("alice")
    return {"api_key": env["E2B_API_KEY"], "api_url": env["E2B_API_URL"]}


# ---------------------------------------------------------------- the end of a sandbox


def test_kill_breaks_a_running_command(opts: dict[str, object]) -> None:
    victim = Sandbox.create(template="base", timeout=300, **opts)  # type: ignore[arg-type]
    handle = victim.commands.run("sleep 60", background=True, timeout=0)
    victim.kill()
    with pytest.raises(TimeoutException) as info:
        handle.wait()
    assert "killed or reached its end of life" in str(info.value)


def test_a_daemon_killed_mid_command_breaks_its_stream(
    opts: dict[str, object], stack: Stack
) -> None:
    """SIGKILL of the sandbox's daemon (no SIGTERM, no end event): the proxy closes the client's
    connection without the answer's end, so the SDK raises its stream error, not "Command ended
    without an end event" from a stream that looked complete."""
    victim = Sandbox.create(template="base", timeout=300, **opts)  # type: ignore[arg-type]
    try:
        handle = victim.commands.run("sleep 60", background=True, timeout=0)
        host = asyncio.run(_host(stack, victim.sandbox_id))
        pid = daemon_pid(host)
        assert pid is not None, f"no daemon listening on {host}"
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(Exception) as info:
            handle.wait()
        assert "without an end event" not in str(info.value), info.value
    finally:
        Sandbox.kill(victim.sandbox_id, **opts)  # type: ignore[arg-type]


async def _host(stack: Stack, sandbox_id: str) -> str:
    async with stack.store() as store:
        record = await store.get(sandbox_id)
    assert record is not None and record.host is not None, record
    return str(record.host)


def test_set_timeout_zero_kills_now(opts: dict[str, object]) -> None:
    doomed = Sandbox.create(template="base", timeout=300, **opts)  # type: ignore[arg-type]
    doomed.set_timeout(0)

    def gone() -> bool:
        try:
            Sandbox.get_info(doomed.sandbox_id, **opts)  # type: ignore[arg-type]
        except NotFoundException:
            return True
        return False

    until(gone, 60, "the kill of a sandbox whose timeout was set to 0")


def test_set_timeout_zero_pauses_an_auto_pause_sandbox(sbx: Sandbox, stack: Stack) -> None:
    sbx.set_timeout(0)
    until(lambda: sbx.get_info().state.value == "paused", 60, "the pause after set_timeout(0)")
    assert sbx.get_metrics() == []  # a paused sandbox has no samples, not an error
    with _api(stack) as api:
        assert api.get(f"/v2/sandboxes/{sbx.sandbox_id}/logs").json() == {"logs": []}
        r = api.get("/sandboxes/metrics", params={"sandbox_ids": sbx.sandbox_id})
        assert r.json() == {"sandboxes": {}}
