"""Snapshots and fork through the unmodified e2b SDK (2.63) against a real stack: create / list /
delete, a snapshot id as the template of a create (files copied, processes replayed), fork of 3
(each with the files and the replayed process, independent of each other and of the source), and
the hostile side: other users' snapshot ids, malformed ids and fields, deleting a snapshot in
use, the count quota, and the stored files out of a sandbox's reach."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from e2b import Sandbox
from e2b.exceptions import RateLimitException, SandboxException, SandboxNotFoundException

from tests.support.stack import Stack
from tests.support.waiting import until

pytestmark = pytest.mark.slow

MARKER_CMD = "sleep 86399"  # a process only the source starts: replayed ones show it


def _api(stack: Stack, user: str = "alice") -> httpx.Client:
    return httpx.Client(base_url=stack.api_url, headers={"X-API-KEY": stack.keys[user]}, timeout=60)


def _refused(r: httpx.Response, field: str) -> None:
    """A 400 whose message names ``field``."""
    assert r.status_code == 400, r.text
    assert field in r.json()["message"]


def _bob(stack: Stack) -> dict[str, object]:
    env = stack.sdk_env("bob")
    return {
        "api_key": env["E2B_API_KEY"],
        "api_url": env["E2B_API_URL"],
        "sandbox_url": env["E2B_SANDBOX_URL"],
    }


def _has_marker(sbx: Sandbox) -> bool:
    return any(MARKER_CMD in " ".join([p.cmd, *p.args]) for p in sbx.commands.list())


@pytest.fixture(scope="module")
def src(opts: dict[str, object]) -> Iterator[Sandbox]:
    """Alice's source sandbox: files in its home and its own volume, a background process."""
    s = Sandbox.create(template="base", timeout=600, **opts)  # type: ignore[arg-type]
    s.files.write("/home/user/state.txt", "state before snapshot")
    s.files.make_dir("/home/user/app")
    s.files.write("/home/user/app/config.json", '{"env": "test"}')
    s.files.write("/workspace/volume.txt", "in the sandbox's own volume")
    s.commands.run(MARKER_CMD, background=True, timeout=0)
    yield s
    Sandbox.kill(s.sandbox_id, **opts)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def snap_id(src: Sandbox, opts: dict[str, object]) -> Iterator[str]:
    info = src.create_snapshot()
    yield info.snapshot_id
    Sandbox.delete_snapshot(info.snapshot_id, **opts)  # type: ignore[arg-type]


# ---------------------------------------------------------------- create / list / delete


def test_snapshot_create_list_delete(src: Sandbox, opts: dict[str, Any]) -> None:
    info = src.create_snapshot()
    assert info.snapshot_id.startswith("snap-")
    assert info.names == []
    assert src.is_running()  # a snapshot never stops its sandbox

    listed = Sandbox.list_snapshots(**opts)
    assert listed.has_next
    assert info.snapshot_id in {s.snapshot_id for s in listed.next_items()}
    by_sandbox = Sandbox.list_snapshots(sandbox_id=src.sandbox_id, **opts).next_items()
    assert info.snapshot_id in {s.snapshot_id for s in by_sandbox}
    other = Sandbox.list_snapshots(sandbox_id="i" + "0" * 19, **opts).next_items()
    assert info.snapshot_id not in {s.snapshot_id for s in other}

    assert Sandbox.delete_snapshot(info.snapshot_id, **opts) is True
    assert Sandbox.delete_snapshot(info.snapshot_id, **opts) is False
    after = Sandbox.list_snapshots(sandbox_id=src.sandbox_id, **opts).next_items()
    assert info.snapshot_id not in {s.snapshot_id for s in after}


def test_named_snapshot_and_name_filter(src: Sandbox, opts: dict[str, Any]) -> None:
    name = f"snap-{uuid.uuid4().hex[:8]}"
    info = Sandbox.create_snapshot(src.sandbox_id, name=name, **opts)
    try:
        assert info.names == [f"alice/{name}:default"]
        found = Sandbox.list_snapshots(name=name, **opts).next_items()
        assert [s.snapshot_id for s in found] == [info.snapshot_id]
        assert Sandbox.list_snapshots(name=f"{name}-nope", **opts).next_items() == []
    finally:
        Sandbox.delete_snapshot(info.snapshot_id, **opts)


def test_list_pagination(src: Sandbox, opts: dict[str, Any]) -> None:
    made = [src.create_snapshot().snapshot_id for _ in range(3)]
    try:
        pages = Sandbox.list_snapshots(sandbox_id=src.sandbox_id, limit=2, **opts)
        seen: list[str] = []
        while pages.has_next:
            page = pages.next_items()
            assert len(page) <= 2
            seen += [s.snapshot_id for s in page]
        assert set(made) <= set(seen)
        assert len(seen) == len(set(seen))  # no snapshot on two pages
        newest_first = [s for s in seen if s in made]
        assert newest_first == list(reversed(made))
    finally:
        for sid in made:
            Sandbox.delete_snapshot(sid, **opts)


# ---------------------------------------------------------------- create from a snapshot


def test_create_from_snapshot_has_files_and_processes(
    snap_id: str, src: Sandbox, opts: dict[str, Any]
) -> None:
    new = Sandbox.create(snap_id, **opts)
    try:
        assert new.sandbox_id != src.sandbox_id
        assert new.files.read("/home/user/state.txt") == "state before snapshot"
        assert new.files.read("/home/user/app/config.json") == '{"env": "test"}'
        assert new.files.read("/workspace/volume.txt") == "in the sandbox's own volume"
        owner = new.commands.run("stat -c %U /home/user/state.txt /workspace/volume.txt")
        assert owner.stdout.split() == ["user", "user"]  # the same in-sandbox owner
        until(lambda: _has_marker(new), 30, "the replayed process")
        # Independent: a write in the new sandbox is not seen by the source.
        new.files.write("/home/user/state.txt", "changed in the copy")
        assert src.files.read("/home/user/state.txt") == "state before snapshot"
    finally:
        new.kill()


def test_files_only_snapshot_starts_no_processes(src: Sandbox, opts: dict[str, Any]) -> None:
    with _api_opts(opts) as api:
        r = api.post(f"/sandboxes/{src.sandbox_id}/snapshots", json={"memory": False})
    assert r.status_code == 201, r.text
    snap = r.json()["snapshotID"]
    try:
        new = Sandbox.create(snap, **opts)
        try:
            assert new.files.read("/home/user/state.txt") == "state before snapshot"
            assert not _has_marker(new)
        finally:
            new.kill()
    finally:
        Sandbox.delete_snapshot(snap, **opts)


def _api_opts(opts: dict[str, Any]) -> httpx.Client:
    return httpx.Client(
        base_url=str(opts["api_url"]), headers={"X-API-KEY": str(opts["api_key"])}, timeout=60
    )


# ---------------------------------------------------------------- fork


def test_fork_of_three(src: Sandbox, opts: dict[str, Any]) -> None:
    before = {s.snapshot_id for s in Sandbox.list_snapshots(**opts).next_items()}
    forks = src.fork(count=3, timeout=300)
    assert len(forks) == 3
    sandboxes = [f for f in forks if isinstance(f, Sandbox)]
    try:
        assert len(sandboxes) == 3, forks
        ids = {f.sandbox_id for f in sandboxes}
        assert len(ids) == 3 and src.sandbox_id not in ids
        assert src.is_running()
        for f in sandboxes:
            assert f.is_running()
            assert f.files.read("/home/user/state.txt") == "state before snapshot"
            until(lambda f=f: _has_marker(f), 30, "the replayed process in a fork")
        # Forks are independent of each other and of the source.
        sandboxes[0].files.write("/home/user/state.txt", "fork 0")
        assert sandboxes[1].files.read("/home/user/state.txt") == "state before snapshot"
        assert sandboxes[2].files.read("/home/user/state.txt") == "state before snapshot"
        assert src.files.read("/home/user/state.txt") == "state before snapshot"
        # Fork's own snapshot is not one of the user's.
        after = {s.snapshot_id for s in Sandbox.list_snapshots(**opts).next_items()}
        assert after <= before
    finally:
        for f in sandboxes:
            f.kill()


def test_fork_of_killed_sandbox_is_not_found(opts: dict[str, Any]) -> None:
    s = Sandbox.create(template="base", timeout=60, **opts)
    s.kill()
    with pytest.raises(SandboxNotFoundException):
        s.fork()


# ---------------------------------------------------------------- hostile


def test_another_users_snapshot_does_not_exist(
    stack: Stack, snap_id: str, src: Sandbox, opts: dict[str, Any]
) -> None:
    bob = _bob(stack)
    with pytest.raises(SandboxException) as created:
        Sandbox.create(snap_id, **bob)  # type: ignore[arg-type]
    assert "404" in str(created.value)
    assert Sandbox.delete_snapshot(snap_id, **bob) is False  # type: ignore[arg-type]
    assert snap_id not in {
        s.snapshot_id
        for s in Sandbox.list_snapshots(**bob).next_items()  # type: ignore[arg-type]
    }
    assert (
        Sandbox.list_snapshots(sandbox_id=src.sandbox_id, **bob).next_items()  # type: ignore[arg-type]
        == []
    )
    with pytest.raises(SandboxNotFoundException):
        Sandbox.create_snapshot(src.sandbox_id, **bob)  # type: ignore[arg-type]
    with pytest.raises(SandboxNotFoundException):
        Sandbox.fork(src.sandbox_id, **bob)  # type: ignore[arg-type]
    # ...and it is still Alice's, untouched.
    assert snap_id in {s.snapshot_id for s in Sandbox.list_snapshots(**opts).next_items()}


@pytest.mark.parametrize(
    "template",
    ["snap-\x00aaaaaaaaaaaaaaaaaaa", "--ro-bind", "snap-" + "a" * 10_000, "snap-../../etc"],
)
def test_hostile_snapshot_ids_in_create(stack: Stack, template: str) -> None:
    with _api(stack) as api:
        r = api.post("/v2/sandboxes", json={"templateID": template, "metadata": {}, "envVars": {}})
    assert r.status_code == 400, r.text
    assert "templateID" in r.json()["message"]


def test_unknown_snapshot_id_in_create_is_404(stack: Stack) -> None:
    with _api(stack) as api:
        r = api.post("/v2/sandboxes", json={"templateID": "snap-" + "0" * 20})
    assert r.status_code == 404, r.text


@pytest.mark.parametrize(
    "path",
    ["snap-%00aaaaaaaaaaaaaaaaaaa", "--ro-bind", "snap-" + "a" * 5000, "sandbox-base", "snap-x"],
)
def test_hostile_ids_in_delete(stack: Stack, path: str) -> None:
    with _api(stack) as api:
        r = api.delete(f"/templates/{path}")
    assert r.status_code == 404, r.text
    assert r.json()["code"] == 404


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"sandboxID": "x" * 100}, "sandboxID"),
        ({"name": "n" * 100}, "name"),
        ({"limit": 0}, "limit"),
        ({"limit": 10**9}, "limit"),
        ({"nextToken": "not base64 !"}, "nextToken"),
        ({"nextToken": "c25hcC0tcm8tYmluZA=="}, "nextToken"),
    ],
)
def test_hostile_list_queries(stack: Stack, params: dict[str, object], field: str) -> None:
    with _api(stack) as api:
        _refused(api.get("/snapshots", params=params), field)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "--ro-bind"}, "name"),
        ({"name": "a\x00b"}, "name"),
        ({"name": "n" * 64}, "name"),
        ({"memory": True}, "memory"),
        ({"surprise": 1}, "surprise"),
    ],
)
def test_hostile_snapshot_requests(
    stack: Stack, src: Sandbox, body: dict[str, object], field: str
) -> None:
    with _api(stack) as api:
        _refused(api.post(f"/sandboxes/{src.sandbox_id}/snapshots", json=body), field)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"count": 0}, "count"),
        ({"count": 21}, "count"),
        ({"count": "three"}, "count"),
        ({"timeout": -1}, "timeout"),
        ({"count": 1, "memory": True}, "memory"),
    ],
)
def test_hostile_fork_requests(
    stack: Stack, src: Sandbox, body: dict[str, object], field: str
) -> None:
    with _api(stack) as api:
        _refused(api.post(f"/sandboxes/{src.sandbox_id}/fork", json=body), field)


def test_snapshot_ids_with_nul_or_options_in_paths(stack: Stack) -> None:
    with _api(stack) as api:
        for sid in ("--ro-bind", "a%00b", "x" * 300):
            assert api.post(f"/sandboxes/{sid}/snapshots", json={}).status_code == 404
            assert api.post(f"/sandboxes/{sid}/fork", json={}).status_code == 404


def test_deleting_a_snapshot_in_use(src: Sandbox, opts: dict[str, Any]) -> None:
    info = src.create_snapshot()
    new = Sandbox.create(info.snapshot_id, **opts)
    try:
        assert Sandbox.delete_snapshot(info.snapshot_id, **opts) is True
        # The sandbox started from it has its own copy and keeps working.
        assert new.files.read("/home/user/state.txt") == "state before snapshot"
        new.files.write("/home/user/after.txt", "still writable")
        assert new.files.read("/home/user/after.txt") == "still writable"
        assert new.is_running()
        # The deleted snapshot starts nothing any more.
        with pytest.raises(SandboxException) as gone:
            Sandbox.create(info.snapshot_id, **opts)
        assert "404" in str(gone.value)
    finally:
        new.kill()


def test_snapshot_quota(stack: Stack) -> None:
    bob = _bob(stack)
    with _api(stack, "root") as admin:
        r = admin.put("/api/v1/users/bob/quota", json={"maxSnapshots": 1})
        assert r.status_code == 200, r.text
    s = Sandbox.create(template="base", timeout=120, **bob)  # type: ignore[arg-type]
    made: list[str] = []
    try:
        made.append(s.create_snapshot().snapshot_id)
        with pytest.raises(RateLimitException):
            s.create_snapshot()
        # The refused one left nothing behind: still exactly one.
        listed = Sandbox.list_snapshots(**bob).next_items()  # type: ignore[arg-type]
        assert [x.snapshot_id for x in listed] == made
        # Fork's own snapshot is not counted against it.
        forks = s.fork()
        assert len(forks) == 1 and isinstance(forks[0], Sandbox), forks
        forks[0].kill()
    finally:
        for sid in made:
            Sandbox.delete_snapshot(sid, **bob)  # type: ignore[arg-type]
        s.kill()
        with _api(stack, "root") as admin:
            admin.put("/api/v1/users/bob/quota", json={})


def test_stored_files_are_out_of_a_sandboxs_reach(stack: Stack, snap_id: str, src: Sandbox) -> None:
    """Snapshots live under the runtime's data dir; no sandbox sees it, not even as root (sudo),
    nor any other copy."""
    store = stack.data_dir / "snapshots"
    assert (store / snap_id / "files").is_dir()  # the copy exists on the host...
    probe = src.commands.run(
        f"test -e {store} && echo VISIBLE; sudo -n test -e {store}/{snap_id} && echo VISIBLE;"
        " sudo -n ls / /tmp /var 2>/dev/null | grep -c snap- ; true",
        timeout=60,
    )
    assert "VISIBLE" not in probe.stdout
    assert probe.stdout.split()[-1] == "0"
