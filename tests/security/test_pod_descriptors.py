"""From inside a real sandbox, as its root: no descriptor of the host can be had, the pod's own
processes cannot be traced, no host path shows in what the sandbox can read, and a flood of the
pod's output grows no host file past its cap.

Before: PID 1 (the inner bwrap, started outside the sandbox's user namespace) and the daemon held
the host file ``pods/<uid>/pod.log`` as stdout/stderr; sandbox root took it with ``pidfd_getfd``
(and wrote through it outside every quota), attached to both with ``PTRACE_SEIZE``, and read
the data dir's path in ``/proc/1/cmdline`` and the daemon's environment (issue 32)."""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
from e2b import Sandbox

from shared.runtime.local import podlog
from shared.runtime.local.spawning import STAGE_DIR
from tests.conftest import skip_or_fail
from tests.security.pod_support import create, pod_of, run
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

# Runs as root inside the sandbox. For every other process: /proc/<pid>/fd, pidfd_getfd of each
# descriptor, PTRACE_SEIZE; each descriptor obtained is classed "own" (a pipe, an anonymous inode,
# a socket of this network namespace, or a file or directory reachable here by its path with the
# same device and inode) or "HOST" (anything else). Prints one JSON line.
WALK = textwrap.dedent(
    """
    import ctypes, errno, json, os, stat
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    SYS_PIDFD_OPEN, SYS_PIDFD_GETFD, PTRACE_SEIZE, PTRACE_DETACH = 434, 438, 0x4206, 17
    me = os.getpid()
    socks = set()
    for table in ("tcp", "tcp6", "udp", "udp6", "unix", "raw", "raw6", "netlink", "packet"):
        try:
            lines = open("/proc/net/" + table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            f = line.split()
            socks.add(f[6] if table == "unix" else f[9] if table != "netlink" else f[-1])
    def kind(fd):
        st = os.fstat(fd)
        link = os.readlink("/proc/self/fd/%d" % fd)
        if stat.S_ISFIFO(st.st_mode) or link.startswith("anon_inode:"):
            return "own"
        if stat.S_ISSOCK(st.st_mode):
            return "own" if link[8:-1] in socks else "HOST socket " + link
        try:
            here = os.stat(link)
            if (here.st_dev, here.st_ino) == (st.st_dev, st.st_ino):
                return "own"
        except OSError:
            pass
        return "HOST " + link
    out = {}
    for pid in sorted(int(p) for p in os.listdir("/proc") if p.isdigit()):
        if pid == me:
            continue
        try:
            cmd = open("/proc/%d/cmdline" % pid, "rb").read().split(b"\\0")[:8]
        except OSError:
            continue
        r = {"cmd": b" ".join(cmd).decode(errors="replace")[:200], "fds": [], "getfd": []}
        try:
            for n in os.listdir("/proc/%d/fd" % pid):
                try:
                    fd = os.open("/proc/%d/fd/%s" % (pid, n), os.O_RDONLY | os.O_NONBLOCK)
                except OSError as e:
                    r["fds"].append(n + " " + errno.errorcode[e.errno])
                    continue
                r["fds"].append(n + " " + kind(fd)); os.close(fd)
        except OSError as e:
            r["fds"].append("list " + errno.errorcode[e.errno])
        pidfd = libc.syscall(SYS_PIDFD_OPEN, pid, 0)
        if pidfd < 0:
            r["getfd"].append("pidfd_open " + errno.errorcode[ctypes.get_errno()])
        else:
            for n in range(256):
                fd = libc.syscall(SYS_PIDFD_GETFD, pidfd, n, 0)
                if fd >= 0:
                    r["getfd"].append("%d %s" % (n, kind(fd))); os.close(fd)
                elif ctypes.get_errno() != errno.EBADF:
                    r["getfd"].append("%d %s" % (n, errno.errorcode[ctypes.get_errno()]))
                    break
            os.close(pidfd)
        if libc.ptrace(PTRACE_SEIZE, pid, None, None) == 0:
            r["seize"] = "ATTACHED"
            libc.ptrace(PTRACE_DETACH, pid, None, None)
        else:
            r["seize"] = errno.errorcode[ctypes.get_errno()]
        for name in ("cmdline", "environ", "maps", "mountinfo", "mounts"):
            try:
                r[name] = open("/proc/%d/%s" % (pid, name), "rb").read().decode(errors="replace")
            except OSError as e:
                r[name] = errno.errorcode[e.errno]
        for name in ("cwd", "exe", "root"):
            try:
                r[name] = os.readlink("/proc/%d/%s" % (pid, name))
            except OSError as e:
                r[name] = errno.errorcode[e.errno]
        out[pid] = r
    print("WALK " + json.dumps(out))
    """
)


VOLUME = "/workspace"  # the seed template's volume (tests/support/stack.py)
# What of each visible process the walk reads that could name a host path.
READABLE = ("cmdline", "environ", "maps", "mountinfo", "mounts", "cwd", "exe", "root")
REPO = Path(__file__).resolve().parents[2]


def spellings(path: str) -> list[str]:
    """``path`` and, when it lies on a filesystem mounted elsewhere than ``/``, its path inside
    that filesystem (what a bind's mountinfo root field shows)."""
    real = os.path.realpath(path)
    found = {path, real}
    best = ("", "/")
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        point, root = fields[4], fields[3]
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best[0]):
            best = (point, root)
    point, root = best
    if point not in ("", "/") or root != "/":
        rest = real[len(point.rstrip("/")) :]
        found.add(os.path.normpath(root.rstrip("/") + "/" + rest.lstrip("/")))
    return sorted(p for p in found if len(p) > 1)


def data_paths(stack: Stack, pod_uid: str) -> list[str]:
    """The host paths of the runtime's data (the data dir, the pods' stage, this pod's folder)."""
    return [*spellings(str(stack.data_dir)), str(STAGE_DIR), f"pods/{pod_uid}"]


def package_paths() -> list[str]:
    """The host paths of the daemon's own package (``services/envd`` of the checkout)."""
    return spellings(str(REPO / "services" / "envd"))


def code_paths() -> list[str]:
    """The host paths of torpor's code: the checkout, the venv, the real interpreter's."""
    paths = [str(REPO), sys.prefix, sys.base_prefix, os.path.realpath(sys.executable)]
    return sorted({s for p in paths for s in spellings(p)})


def leaks(procs: dict[int, dict[str, object]], paths: list[str]) -> list[str]:
    """Every line of every readable /proc entry of every process that names one of ``paths``."""
    found = []
    for pid, r in procs.items():
        for name in READABLE:
            for line in str(r[name]).replace("\0", "\n").splitlines():
                named = [p for p in paths if p in line]
                if named:
                    found.append(f"{pid} {name}: {named[0]} in {line[:300]!r}")
    return found


def walk(sbx: Sandbox) -> dict[int, dict[str, object]]:
    sbx.files.write("/tmp/walk.py", WALK)
    code, out = run(sbx, "python3 /tmp/walk.py", user="root", timeout=120)
    assert code == 0, out
    [line] = [ln for ln in out.splitlines() if ln.startswith("WALK ")]
    return {int(k): v for k, v in json.loads(line[5:]).items()}


@pytest.mark.parametrize("after", ["start", "memory pause"])
def test_no_host_descriptor_trace_or_path_from_inside(stack: Stack, after: str) -> None:
    """Also after a memory pause: CRIU restores no Landlock domain, so only the restored
    dumpable flags (PID 1's sealed in its image, the daemon's own) keep them out of reach."""
    sbx = create(stack)
    try:
        # A sandbox process of its own, holding a file, to show the walk sees what it can reach.
        run(sbx, "sleep 300 < /etc/hostname > /dev/null 2>&1 &", timeout=10, user="root")
        if after == "memory pause":
            sbx.pause(mode="full")
            sbx = Sandbox.connect(sbx.sandbox_id, **stack.sdk_opts("alice"))
            with stack.client("alice") as api:
                report = api.get(f"/api/v1/sandbox/{sbx.sandbox_id}").json()["lastResume"]
            if not report["memoryKept"] and "CRIU is not usable" in (report["memoryNote"] or ""):
                skip_or_fail(report["memoryNote"])
            assert report["memoryKept"] is True, report
        procs = walk(sbx)
        pod = pod_of(stack, sbx.sandbox_id)
        daemons = [p for p, r in procs.items() if "services.envd" in str(r["cmd"])]
        assert 1 in procs and daemons, json.dumps(procs, indent=1)
        sleeper = [p for p, r in procs.items() if str(r["cmd"]).startswith("sleep")]
        assert sleeper and any("own" in f for f in procs[sleeper[0]]["getfd"]), procs  # type: ignore[union-attr]
        for pid, r in procs.items():
            got = [*r["fds"], *r["getfd"]]  # type: ignore[misc]
            assert not [f for f in got if "HOST" in f], (pid, r["cmd"], got)
        # No host path of the runtime's data in anything of any process: command lines,
        # environments, maps, mount tables (mount roots, sources, overlay options), links.
        paths = [*data_paths(stack, pod.uid), *package_paths()]
        leaked = leaks(procs, paths)
        assert not leaked, "\n".join(leaked)
        for pid in (1, *daemons):  # the pod's own processes: out of the sandbox's reach
            r = procs[pid]
            assert r["seize"] == "EPERM", (pid, r["cmd"], r["seize"])
            assert r["getfd"] in (["0 EPERM"], ["pidfd_open EPERM"]), (pid, r["getfd"])
            opened = [f for f in r["fds"] if not f.endswith("EACCES")]  # type: ignore[union-attr]
            assert not opened, (pid, r["fds"])
        assert sbx.commands.run("echo alive").stdout.strip() == "alive"
    finally:
        sbx.kill()


def test_the_out_of_reach_domain_leaves_moves_and_links_across_folders_working(
    stack: Stack,
) -> None:
    """The daemon's Landlock domain denies reparenting unless a rule grants it: without its
    rule beneath /, every cross-folder rename or hard link in a sandbox failed with EXDEV (pip
    building from source, git, editors)."""
    sbx = create(stack)
    try:
        for user in ("user", "root"):
            script = (
                "set -e; d=$(mktemp -d); mkdir -p $d/a/b; echo moved > $d/a/b/f; "
                "mv $d/a/b/f $d/a/f; ln $d/a/f $d/a/b/g; mv $d/a/b $d/c; mv $d/c /tmp/moved-$$; "
                "cat $d/a/f /tmp/moved-$$/g"
            )
            code, out = run(sbx, script, user=user, timeout=30)
            assert code == 0 and out.split() == ["moved", "moved"], (user, code, out)
    finally:
        sbx.kill()


OWN_COMMAND = "reach-own-command"


def test_a_templates_own_command_cannot_reach_pid_1(stack: Stack) -> None:
    """A template with its own ``command`` runs no daemon to enter the out-of-reach domain for
    it: before the entry step (``services/envd/reach.py``), that command (sandbox code, as the
    sandbox's root) attached to PID 1 with ``PTRACE_SEIZE`` and took its descriptors with
    ``pidfd_getfd``. Here the command walks first, as tenant code would, then execs the daemon
    only so the test can read what it found."""
    script = (
        'python3 -c "$WALK_PY" > /tmp/walk.out 2>&1; '
        'exec "$0" -m services.envd --listen {host}:{port} --root {root}'
    )
    (stack.templates_dir / f"{OWN_COMMAND}.yaml").write_text(
        f"name: {OWN_COMMAND}\nworkdir: /workspace\n"
        f"env: {json.dumps({'WALK_PY': WALK})}\n"
        f"command: {json.dumps(['/bin/sh', '-c', script, '{python}'])}\n"
    )
    sbx = Sandbox.create(template=OWN_COMMAND, timeout=300, **stack.sdk_opts("alice"))
    try:
        out = sbx.files.read("/tmp/walk.out", user="root")
        [line] = [ln for ln in out.splitlines() if ln.startswith("WALK ")]
        procs = {int(k): v for k, v in json.loads(line[5:]).items()}
        assert 1 in procs, out
        r = procs[1]
        assert r["seize"] == "EPERM", (r["cmd"], r["seize"])
        assert r["getfd"] in (["0 EPERM"], ["pidfd_open EPERM"]), r["getfd"]
        assert not [f for f in r["fds"] if not f.endswith("EACCES")], r["fds"]
        assert r["environ"] == "EACCES", r["environ"]
        # The command ran with its own argv (the walk ran, then the daemon it execs answers).
        assert sbx.commands.run("echo alive").stdout.strip() == "alive"
    finally:
        sbx.kill()


FLOOD = "podlog-flood"
FLOOD_BYTES = 2**30


def flood_template(stack: Stack) -> None:
    """A template whose pod writes 1 GiB to its output (PID 1's stdout) before its daemon
    starts."""
    script = (
        f'head -c {FLOOD_BYTES} /dev/zero; echo flooded-then-started; exec "$0" -m services.envd '
        "--listen {host}:{port} --root {root}"
    )
    (stack.templates_dir / f"{FLOOD}.yaml").write_text(
        f"name: {FLOOD}\nworkdir: /workspace\n"
        f"command: {json.dumps(['/bin/sh', '-c', script, '{python}'])}\n"
    )


def pod_log_files(stack: Stack) -> dict[str, int]:
    return {
        str(p.relative_to(stack.data_dir)): p.stat().st_size
        for p in [
            *(stack.data_dir / "pods").glob("*/pod.log*"),
            *(stack.data_dir / "logs").glob("*"),
        ]
    }


def test_a_flood_of_the_pods_output_grows_no_host_file_past_the_cap(stack: Stack) -> None:
    flood_template(stack)
    sbx = Sandbox.create(template=FLOOD, timeout=300, **stack.sdk_opts("alice"))
    try:
        uid = pod_of(stack, sbx.sandbox_id).uid
        pod_dir = stack.data_dir / "pods" / uid
        assert sbx.commands.run("echo alive").stdout.strip() == "alive"
        deadline = time.monotonic() + 30
        while "flooded-then-started" not in podlog.tail(pod_dir, 4096):
            assert time.monotonic() < deadline, pod_log_files(stack)
            time.sleep(0.2)
        sizes = pod_log_files(stack)
        assert sum(v for k, v in sizes.items() if uid in k) <= podlog.DEFAULT_CAP, sizes
        assert all(v <= podlog.DEFAULT_CAP for v in sizes.values()), sizes
    finally:
        sbx.kill()
    # The dead pod's log kept in logs/ is bounded too.
    assert all(v <= podlog.DEFAULT_CAP for v in pod_log_files(stack).values())


def test_tail_reads_at_most_its_cap(tmp_path: Path) -> None:
    (tmp_path / "pod.log.1").write_bytes(b"a" * 100 + b"\nolder\n")
    (tmp_path / "pod.log").write_bytes(b"newer\n" + b"\xff" * 10)
    assert podlog.tail(tmp_path, 1000).startswith("a" * 100)
    assert podlog.tail(tmp_path, 20).endswith("newer\n" + "\ufffd" * 10)
    assert len(podlog.tail(tmp_path, 12).encode()) <= 12 * 3
    assert podlog.tail(tmp_path / "missing", 10) == ""
    os.symlink("/etc/shadow", tmp_path / "link")
    (tmp_path / "pod.log").unlink()
    os.symlink("/etc/shadow", tmp_path / "pod.log")
    assert "root" not in podlog.tail(tmp_path, 1000)  # a planted link is never followed


def test_a_volume_names_no_host_path(stack: Stack) -> None:
    """The seed template's /workspace volume (``volumes/<owner>/<id>/workspace``), as sandbox
    root sees it in the mount table: the root of the volumes' own filesystem (.volume_fs), its
    files where they always were on the host."""
    sbx = create(stack)
    try:
        pod = pod_of(stack, sbx.sandbox_id)
        procs = walk(sbx)
        leaked = leaks(procs, data_paths(stack, pod.uid))
        assert not leaked, "\n".join(leaked)
        entries = {
            line.split(" ")[3]
            for r in procs.values()
            for line in str(r["mountinfo"]).splitlines()
            if line.split(" ")[4:5] == [VOLUME]
        }
        assert entries == {f"/alice/{sbx.sandbox_id}/workspace"}, entries
        sbx.files.write(f"{VOLUME}/written-inside.txt", "kept")
        on_host = stack.data_dir / "volumes" / "alice" / sbx.sandbox_id / "workspace"
        assert (on_host / "written-inside.txt").read_text() == "kept"
    finally:
        sbx.kill()


def test_no_host_path_of_the_code_from_inside(stack: Stack) -> None:
    """The daemon's interpreter, venv and code, as sandbox root sees them: no host path of the
    checkout, the venv or the interpreter in any process's command line, environment, maps,
    mount table or links, nor in a file name under /run/torpor-daemon (the bytecode cache's
    folders are its sources' paths, without the leading slash)."""
    sbx = create(stack)
    try:
        leaked = leaks(walk(sbx), code_paths())
        assert not leaked, "\n".join(leaked)
        code, names = run(sbx, "find /run/torpor-daemon", user="root", timeout=120)
        assert code == 0 and "/run/torpor-daemon/py/bin/" in names, names[-500:]
        named = [
            line for line in names.splitlines() if any(p.strip("/") in line for p in code_paths())
        ]
        assert not named, "\n".join(named[:20])
    finally:
        sbx.kill()
