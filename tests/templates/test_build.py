"""Templates users build, end to end with the unmodified ``e2b`` SDK on the local runtime:
Template(...).build(), then Sandbox.create(name) and name:tag."""

from __future__ import annotations

import os
import re
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from e2b import Sandbox, SandboxQuery, SandboxState, Template
from e2b.exceptions import BuildException, SandboxException

from shared.runtime.local import layer_ids
from tests.support.packages import build_deb, write_wheel
from tests.support.stack import Stack


def _wheel(folder: Path) -> None:
    """A pure-Python wheel, made here (pip installs it with --no-index: no download)."""
    dist = "torpor_demo-1.0.dist-info"
    files = {
        "torpor_demo/__init__.py": "GREETING = 'hello from a wheel'\n",
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: torpor-demo\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{dist}/RECORD,,\n"
    write_wheel(folder / "torpor_demo-1.0-py3-none-any.whl", {**files, f"{dist}/RECORD": record})


def _deb(folder: Path, work: Path) -> None:
    """A tiny .deb, made here with dpkg-deb (installed with dpkg -i: no download)."""
    build_deb(
        folder / "torpor-hello.deb",
        work / "deb",
        "Package: torpor-hello\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: torpor <t@example.invalid>\nDescription: test package\n",
        {"usr/share/torpor-hello/hello.txt": "hello from a deb\n"},
    )


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Path:
    ctx = tmp_path_factory.mktemp("context")
    (ctx / "pkgs").mkdir()
    _wheel(ctx / "pkgs")
    _deb(ctx / "pkgs", tmp_path_factory.mktemp("debwork"))
    (ctx / "pkgs" / "latest.deb").symlink_to("torpor-hello.deb")  # an in-context symlink
    (ctx / "app").mkdir()
    (ctx / "app" / "config.txt").write_text("copied into the template\n")
    return ctx


def _api(stack: Stack, user: str = "alice") -> dict[str, Any]:
    return {"api_key": stack.keys[user], "api_url": stack.api_url}


def _template(context: Path, marker: str) -> Any:
    return (
        Template(file_context_path=str(context))
        .from_debian_image("bookworm")
        .copy("pkgs/", "/opt/pkgs/")
        .run_cmd("dpkg -i /opt/pkgs/torpor-hello.deb", user="root")
        .pip_install(["--no-index", "--find-links=/opt/pkgs", "torpor-demo"])
        .copy("app/config.txt", "/home/user/app/config.txt")
        .run_cmd(f"echo {marker} > /home/user/marker.txt")
        .set_start_cmd(
            "echo started > /tmp/started.txt && sleep infinity", "test -f /tmp/started.txt"
        )
    )


@pytest.fixture(scope="module")
def built(tstack: Stack, context: Path) -> dict[str, Any]:
    name = f"tpl-{uuid.uuid4().hex[:8]}"
    logs: list[str] = []
    info = Template.build(
        _template(context, "one"),
        name,
        tags=["v1"],
        on_build_logs=lambda e: logs.append(e.message),
        **_api(tstack),
    )
    return {"name": name, "info": info, "logs": logs}


def test_sandbox_from_name_has_packages_file_and_start_command(
    tstack: Stack, built: dict[str, Any]
) -> None:
    sbx = Sandbox.create(built["name"], **tstack.sdk_opts("alice"))
    try:
        out = sbx.commands.run(
            "cat /usr/share/torpor-hello/hello.txt /home/user/app/config.txt "
            "/home/user/marker.txt /tmp/started.txt && "
            "python3 -c 'import torpor_demo; print(torpor_demo.GREETING)'"
        )
        assert out.stdout.split("\n")[:5] == [
            "hello from a deb",
            "copied into the template",
            "one",
            "started",
            "hello from a wheel",
        ]
        # the start command runs as one of the sandbox's processes
        assert any("sleep infinity" in " ".join([p.cmd, *p.args]) for p in sbx.commands.list())
        # files copied for `user` are hers; her home is still hers
        owners = sbx.commands.run("stat -c %U /home/user/app/config.txt /home/user").stdout
        assert owners.split() == ["user", "user"]
        # an in-context symlink is copied as a link, and works in the sandbox
        link = sbx.commands.run(
            "readlink /opt/pkgs/latest.deb && dpkg-deb -f /opt/pkgs/latest.deb Package"
        )
        assert link.stdout.split() == ["torpor-hello.deb", "torpor-hello"]
    finally:
        sbx.kill()


def _host_state(path: Path) -> list[tuple[str, int, int, int, bytes]]:
    out = []
    for entry in [path, *sorted(path.rglob("*"))]:
        st = entry.lstat()
        data = entry.read_bytes() if entry.is_file() and not entry.is_symlink() else b""
        out.append((str(entry), st.st_uid, st.st_gid, st.st_mode, data))
    return out


def test_a_hostile_context_changes_nothing_on_the_host(tstack: Stack, tmp_path: Path) -> None:
    """Issue 32's critical escape through the real builder and the unmodified SDK: a COPY's
    first glob match plants symlinks to a host folder (absolute, and relative with ``..``) in
    the layer, the next match brings folders of the same names (a file named like the host's,
    a new file, a nested folder). The host folder keeps its content, owners and modes; the
    sandbox sees the tenant's files in real folders."""
    host = tmp_path / "host-sentinel"
    (host / "dir").mkdir(parents=True)
    (host / "secret").write_text("host secret\n")
    os.chmod(host / "secret", 0o600)
    ctx = tmp_path / "ctx"
    (ctx / "h" / "a").mkdir(parents=True)
    os.symlink(str(host), ctx / "h" / "a" / "s")
    os.symlink("../" * 40 + str(host).lstrip("/"), ctx / "h" / "a" / "r")
    for name in ("s", "r"):
        (ctx / "h" / "b" / name / "dir").mkdir(parents=True)
        (ctx / "h" / "b" / name / "secret").write_text(f"tenant {name}\n")
        (ctx / "h" / "b" / name / "dir" / "deep").write_text("deep\n")
    before = _host_state(host)
    name = f"tpl-{uuid.uuid4().hex[:8]}"
    template = (
        Template(file_context_path=str(ctx)).from_debian_image("bookworm").copy("h/*", "/opt/app/")
    )
    Template.build(template, name, **_api(tstack))
    assert _host_state(host) == before
    sbx = Sandbox.create(name, **tstack.sdk_opts("alice"))
    try:
        out = sbx.commands.run(
            "cat /opt/app/s/secret /opt/app/r/secret /opt/app/r/dir/deep; "
            "test -L /opt/app/s || test -L /opt/app/r || echo real-folders"
        )
        assert out.stdout.split("\n")[:4] == ["tenant s", "tenant r", "deep", "real-folders"]
    finally:
        sbx.kill()
    assert _host_state(host) == before


def test_sandbox_from_tag(tstack: Stack, built: dict[str, Any]) -> None:
    sbx = Sandbox.create(f"{built['name']}:v1", **tstack.sdk_opts("alice"))
    try:
        assert sbx.commands.run("cat /home/user/marker.txt").stdout.strip() == "one"
        # E2B's templateID of a sandbox is the template's id, never the build it started from
        info = built["info"]
        assert info.build_id != info.template_id
        assert sbx.get_info().template_id == info.template_id
    finally:
        sbx.kill()


def test_create_get_and_list_answer_the_template_id(tstack: Stack, built: dict[str, Any]) -> None:
    tid = built["info"].template_id
    with tstack.client("alice") as c:
        created = c.post("/v2/sandboxes", json={"templateID": built["name"]})
        assert created.status_code == 201, created.text
        sid = created.json()["sandboxID"]
        try:
            assert created.json()["templateID"] == tid
            assert c.get(f"/v2/sandboxes/{sid}").json()["templateID"] == tid
            listed = {s["sandboxID"]: s["templateID"] for s in c.get("/v2/sandboxes").json()}
            assert listed[sid] == tid
            by_template = c.get("/v2/sandboxes", params={"template": tid}).json()
            assert sid in {s["sandboxID"] for s in by_template}
            other = c.get("/v2/sandboxes", params={"template": "base"}).json()
            assert sid not in {s["sandboxID"] for s in other}
        finally:
            assert c.delete(f"/sandboxes/{sid}").status_code == 204


def test_rebuild_with_one_change_reuses_the_earlier_steps(
    tstack: Stack, context: Path, built: dict[str, Any]
) -> None:
    info = Template.build(_template(context, "two"), f"{built['name']}:v2", **_api(tstack))
    with tstack.client("alice") as c:
        status = c.get(f"/templates/{info.template_id}/builds/{info.build_id}/status").json()
    cached = [e["message"] for e in status["logEntries"] if e["message"].startswith("CACHED")]
    # steps 1-5 are unchanged (copy, dpkg, pip, copy); step 5, the echo, changed
    assert [m.split("]")[0] for m in cached] == [
        "CACHED [1/5",
        "CACHED [2/5",
        "CACHED [3/5",
        "CACHED [4/5",
    ]
    sbx = Sandbox.create(f"{built['name']}:v2", **tstack.sdk_opts("alice"))
    try:
        assert sbx.commands.run("cat /home/user/marker.txt").stdout.strip() == "two"
    finally:
        sbx.kill()


def test_failing_step_reports_its_log_and_exit_code(tstack: Stack) -> None:
    template = Template().from_debian_image().run_cmd("echo about to fail; exit 7")
    with pytest.raises(BuildException) as failed:
        Template.build(template, f"fail-{uuid.uuid4().hex[:8]}", **_api(tstack))
    assert "exit status 7" in str(failed.value)


def test_another_user_cannot_see_use_or_delete_it(tstack: Stack, built: dict[str, Any]) -> None:
    tid = built["info"].template_id
    assert Template.exists(built["name"], **_api(tstack)) is True
    assert Template.exists(built["name"], **_api(tstack, "bob")) is False
    with tstack.client("bob") as c:
        assert c.get(f"/templates/{tid}").status_code == 404
        assert c.delete(f"/templates/{tid}").status_code == 404
        assert all(t["templateID"] != tid for t in c.get("/templates").json())
        r = c.post("/v2/sandboxes", json={"templateID": built["name"]})
        assert r.status_code == 400
    with tstack.client("alice") as c:
        assert c.get(f"/templates/{tid}").status_code == 200


def test_delete(tstack: Stack, context: Path) -> None:
    name = f"del-{uuid.uuid4().hex[:8]}"
    info = Template.build(Template().from_debian_image().run_cmd("true"), name, **_api(tstack))
    with tstack.client("alice") as c:
        assert c.delete(f"/templates/{info.template_id}").status_code == 204
        assert c.get(f"/templates/{info.template_id}").status_code == 404
    assert Template.exists(name, **_api(tstack)) is False
    with httpx.Client(base_url=tstack.api_url, headers={"X-API-KEY": tstack.keys["alice"]}) as c:
        assert c.post("/v2/sandboxes", json={"templateID": name}).status_code == 400


def test_ready_command_that_never_succeeds_fails_the_create(tstack: Stack) -> None:
    """Not a 504 "still in progress" retried forever: after the scaler's ready timeout the
    create fails with the ready command's last exit code and output, and its pod is gone."""
    name = f"unready-{uuid.uuid4().hex[:8]}"
    template = Template().from_debian_image().set_start_cmd("sleep 1000", "echo not yet; exit 3")
    info = Template.build(template, name, **_api(tstack))
    with pytest.raises(SandboxException) as failed:
        Sandbox.create(name, **tstack.sdk_opts("alice"))
    reason = str(failed.value)
    assert "ready command failed: exit 3: not yet" in reason, reason
    assert "still in progress" not in reason
    with tstack.client("alice") as c:
        mine = [s for s in c.get("/v2/sandboxes").json() if s["templateID"] == info.template_id]
        assert len(mine) == 1
        native = c.get(f"/api/v1/sandbox/{mine[0]['sandboxID']}").json()
        e2b = c.get(f"/v2/sandboxes/{mine[0]['sandboxID']}").json()
    assert native["state"] == "failed"
    # E2B knows only running and paused: failed reads as paused (a connect resumes it).
    assert e2b["state"] == mine[0]["state"] == "paused"
    sid = mine[0]["sandboxID"]
    opts = tstack.sdk_opts("alice")
    paused = Sandbox.list(query=SandboxQuery(state=[SandboxState.PAUSED]), **opts).next_items()
    running = Sandbox.list(query=SandboxQuery(state=[SandboxState.RUNNING]), **opts).next_items()
    assert sid in {s.sandbox_id for s in paused}
    assert sid not in {s.sandbox_id for s in running}
    assert _no_pods_within(tstack, 30), "the never-ready pod was left running"


def _no_pods_within(stack: Stack, seconds: float) -> bool:
    pods = stack.data_dir / "pods"
    deadline = time.monotonic() + seconds
    while any(pods.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return not any(pods.iterdir())


def test_ready_command_that_never_succeeds_fails_the_resume_back_to_paused(
    tstack: Stack,
) -> None:
    """A resumed pod whose ready command keeps failing: the SDK's connect gets an error naming
    the ready command's exit code and output (not a hang, not a retry), the sandbox stays paused
    with its snapshot, its pod is stopped, and a later resume brings it back.

    The ready command counts its own attempts once the sandbox wrote ``unready``; it succeeds
    only after more attempts than fit into one ready timeout (one every half second at most), so
    the first resume fails and the second one, continuing the count, succeeds."""
    ready_timeout = float(tstack.env["TORPOR_SCALER_READY_TIMEOUT"])
    needed = int(2 * ready_timeout) + 10
    count = "/home/user/unready"
    ready = (
        f"[ ! -e {count} ] || {{ n=$(( $(cat {count}) + 1 )); echo $n > {count}; "
        f"[ $n -gt {needed} ] || {{ echo not yet; exit 3; }}; }}"
    )
    name = f"unresumable-{uuid.uuid4().hex[:8]}"
    template = Template().from_debian_image().set_start_cmd("sleep infinity", ready)
    Template.build(template, name, **_api(tstack))
    sbx = Sandbox.create(name, **tstack.sdk_opts("alice"))
    sid = sbx.sandbox_id
    try:
        sbx.files.write("/home/user/kept.txt", "written before the pause")
        sbx.files.write(count, "0")
        sbx.pause()
        with tstack.client("alice") as c:
            snapshot = c.get(f"/api/v1/sandbox/{sid}").json()["snapshot"]
        assert snapshot is not None

        with pytest.raises(SandboxException) as failed:
            Sandbox.connect(sid, **tstack.sdk_opts("alice"))
        reason = str(failed.value)
        assert "ready command failed: exit 3: not yet" in reason, reason
        assert "still in progress" not in reason
        with tstack.client("alice") as c:
            native = c.get(f"/api/v1/sandbox/{sid}").json()
            e2b = c.get(f"/v2/sandboxes/{sid}").json()
        assert native["state"] == "paused", native
        assert native["snapshot"] == snapshot
        assert "ready command failed: exit 3" in native["failure"]
        assert e2b["state"] == "paused"
        assert _no_pods_within(tstack, 30), "its pod was left running"

        again = Sandbox.connect(sid, **tstack.sdk_opts("alice"))
        assert again.commands.run("cat /home/user/kept.txt").stdout == "written before the pause"
        assert any("sleep infinity" in " ".join([p.cmd, *p.args]) for p in again.commands.list())
    finally:
        Sandbox.kill(sid, **tstack.sdk_opts("alice"))


def test_ready_command_checking_the_start_commands_process_passes_on_a_resume(
    tstack: Stack,
) -> None:
    """The ready command checks that the start command's process runs. On a resume the start
    command is not run by the daemon again (its marker is among the kept files) but replayed
    with the snapshot's processes: the replay must not wait for the ready command, which only
    that process can satisfy (before, every resume timed out back to paused)."""
    # ``exec -a`` names the process; the ready command's own command line spells the name with
    # quotes inside, so only the start command's process matches.
    start = "exec -a torpor-beat sleep infinity"
    ready = "grep -qsF torpor''-beat /proc/[0-9]*/cmdline || { echo no beat; exit 4; }"
    name = f"startdep-{uuid.uuid4().hex[:8]}"
    Template.build(Template().from_debian_image().set_start_cmd(start, ready), name, **_api(tstack))
    opts = tstack.sdk_opts("alice")
    sbx = Sandbox.create(name, **opts)
    sid = sbx.sandbox_id
    try:
        sbx.files.write("/home/user/kept.txt", "written before the pause")
        sbx.pause()
        again = Sandbox.connect(sid, **opts)
        with tstack.client("alice") as c:
            native = c.get(f"/api/v1/sandbox/{sid}").json()
        assert native["state"] == "running", native
        assert again.commands.run("cat /home/user/kept.txt").stdout == "written before the pause"
        running = [" ".join([p.cmd, *p.args]) for p in again.commands.list()]
        assert sum(start in line for line in running) == 1, running
        beat = again.commands.run("grep -lsF torpor''-beat /proc/[0-9]*/cmdline")
        assert beat.stdout.strip(), "the start command's process is not running"
    finally:
        Sandbox.kill(sid, **opts)


def _metric(stack: Stack, name: str, kind: str) -> float | None:
    text = httpx.get(f"{stack.url('builder')}/metrics", timeout=10).text
    found = re.search(rf'^{name}{{kind="{kind}"}} (\S+)$', text, re.MULTILINE)
    return float(found.group(1)) if found else None


def _sweeps(stack: Stack) -> float:
    text = httpx.get(f"{stack.url('builder')}/metrics", timeout=10).text
    found = re.search(r"^torpor_builder_gc_sweeps_total (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_a_deleted_templates_sandboxes_run_on_and_its_layers_go_after_them(
    tstack: Stack,
) -> None:
    """Delete a template while one sandbox of it runs and another is paused: both work on
    (the paused one resumes); once both are gone the builder's garbage collection removes the
    template's own layer and file, and reports the disk in use."""
    marker = uuid.uuid4().hex
    name = f"gc-{marker[:8]}"
    template = Template().from_debian_image().run_cmd(f"echo {marker} > /home/user/gc.txt")
    info = Template.build(template, name, **_api(tstack))
    template_file = tstack.data_dir / "built-templates" / f"{info.build_id}.yaml"
    own = yaml.safe_load(template_file.read_text())["layers"][-1]  # the RUN step: only its
    own_layer = tstack.data_dir / "template-layers" / own
    assert own_layer.is_dir()
    opts = tstack.sdk_opts("alice")
    running = Sandbox.create(name, **opts)
    paused = Sandbox.create(name, **opts)
    ids = [running.sandbox_id, paused.sandbox_id]
    try:
        paused.pause()
        with tstack.client("alice") as c:
            assert c.delete(f"/templates/{info.template_id}").status_code == 204
        swept = _sweeps(tstack)
        deadline = time.monotonic() + 60
        while _sweeps(tstack) < swept + 3 and time.monotonic() < deadline:  # past the grace
            time.sleep(0.5)
        assert _sweeps(tstack) >= swept + 3, "the garbage collection does not sweep"
        assert own_layer.is_dir() and template_file.is_file()
        assert running.commands.run("cat /home/user/gc.txt").stdout.strip() == marker
        resumed = Sandbox.connect(paused.sandbox_id, **opts)
        assert resumed.commands.run("cat /home/user/gc.txt").stdout.strip() == marker
    finally:
        for sid in ids:
            Sandbox.kill(sid, **opts)
    deadline = time.monotonic() + 60
    while (own_layer.exists() or template_file.exists()) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not own_layer.exists(), "the deleted template's layer was not collected"
    assert not template_file.exists()
    assert (_metric(tstack, "torpor_builder_gc_removed_total", "layers") or 0) >= 1
    for kind in ("layers", "cache", "uploads"):  # the disk in use, as of the last sweep
        assert _metric(tstack, "torpor_builder_disk_bytes", kind) is not None


def test_the_step_cache_is_the_owners_alone(tstack: Stack) -> None:
    """bob building alice's exact steps gets none of her cached layers (a hit would tell him she
    ran them and hand him what they made); alice's own rebuild does, so the check can fail."""
    step = f"echo cached-for-one-owner-{uuid.uuid4().hex[:8]} > /tmp/step.txt"

    def cached(user: str) -> list[str]:
        template = Template().from_debian_image().run_cmd(step)
        info = Template.build(template, f"own-{uuid.uuid4().hex[:8]}", **_api(tstack, user))
        with tstack.client(user) as c:
            url = f"/templates/{info.template_id}/builds/{info.build_id}/status"
            entries = c.get(url).json()["logEntries"]
        return [e["message"] for e in entries if e["message"].startswith("CACHED")]

    assert cached("alice") == []
    assert cached("bob") == []
    assert [m.split("]")[0] for m in cached("alice")] == ["CACHED [1/1"]


def _layer_trees(stack: Stack) -> list[Path]:
    return sorted((stack.data_dir / "template-layers").glob("*/tree"))


def _owners(tree: Path) -> set[tuple[int, int]]:
    return {(e.lstat().st_uid, e.lstat().st_gid) for e in [tree, *tree.rglob("*")]}


_IN_SANDBOX_OWNERS = (
    "stat -c '%u:%g' /usr/share/torpor-hello/hello.txt /home/user/app/config.txt "
    "/home/user/marker.txt /opt/pkgs/torpor-hello.deb"
)


def test_layers_are_owned_by_no_host_user_and_pods_see_the_sandboxs_ids(
    tstack: Stack, built: dict[str, Any]
) -> None:
    """Issue 32: a built layer's files are stored in the layer range (no host user, not host root
    or uid 1000, owns one); a sandbox of the template sees them as its root's and `user`'s."""
    trees = _layer_trees(tstack)
    assert trees
    low, high = layer_ids.LAYER_BASE, layer_ids.LAYER_BASE + layer_ids.IDS
    for tree in trees:
        assert layer_ids.is_stored(tree), tree
        assert all(low <= u < high and low <= g < high for u, g in _owners(tree)), tree
    sbx = Sandbox.create(built["name"], **tstack.sdk_opts("alice"))
    try:
        owners = sbx.commands.run(_IN_SANDBOX_OWNERS).stdout.split()
        assert owners == ["0:0", "1000:1000", "1000:1000", "1000:1000"]
    finally:
        sbx.kill()


def test_a_layer_of_an_older_torpor_is_shifted_when_a_pod_next_mounts_it(
    tstack: Stack, built: dict[str, Any]
) -> None:
    """Layers stored with the sandbox's own ids (and no mark) by an older torpor: the next pod
    that mounts one while no other pod does stores it shifted, and sees the same owners."""
    trees = _layer_trees(tstack)
    for tree in trees:  # what an older torpor left: the sandbox's ids, no mark
        for entry in [tree, *tree.rglob("*")]:
            st = entry.lstat()
            os.chown(
                entry,
                st.st_uid - layer_ids.LAYER_BASE,
                st.st_gid - layer_ids.LAYER_BASE,
                follow_symlinks=False,
            )
        (tree.parent / layer_ids.MARK).unlink()
    assert {0, 1000} >= {u for t in trees for u, _ in _owners(t)}
    sbx = Sandbox.create(built["name"], **tstack.sdk_opts("alice"))
    try:
        assert sbx.commands.run(_IN_SANDBOX_OWNERS).stdout.split() == [
            "0:0",
            "1000:1000",
            "1000:1000",
            "1000:1000",
        ]
    finally:
        sbx.kill()
    used = [t for t in trees if layer_ids.is_stored(t)]
    assert used  # the template's own layers, mounted by that pod
    for tree in used:
        assert min(u for u, _ in _owners(tree)) >= layer_ids.LAYER_BASE
