"""From inside a sandbox (code run through the unmodified e2b SDK against a real stack): root in
the sandbox is not root on the host, kernel knobs are read-only, no host secret is visible; and
the runtime itself refuses hostile values that would otherwise become bwrap options."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from shared.errors import PodNotReady, RuntimeFailure
from shared.ports.workloads import WorkloadSpec
from shared.runtime.local import LocalRuntime, procfs, userns
from shared.runtime.local.records import WorkloadRecord, WorkloadStore
from tests.contract.harness import read_file
from tests.security.pod_support import create, host_uids, pod_of, pod_pids, run
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def test_sandbox_root_is_an_unprivileged_host_uid_range(stack: Stack) -> None:
    a, b = create(stack), create(stack)
    try:
        ranges = []
        for sbx in (a, b):
            probe = "id -u; cat /proc/self/uid_map; grep CapEff /proc/self/status"
            code, out = run(sbx, probe, user="root")
            assert code == 0, out
            lines = out.splitlines()
            assert lines[0] == "0"  # root inside...
            inside, base, count = (int(x) for x in lines[1].split())
            assert (inside, count) == (0, userns.IDS_PER_POD)
            assert base >= userns.FIRST_BASE  # ...an ordinary, unprivileged uid outside
            # Only what root needs over its own namespace's files and processes (bwrap.py):
            # CHOWN 0, DAC_OVERRIDE 1, FOWNER 3, FSETID 4, KILL 5, SETGID 6, SETUID 7.
            assert lines[2].split()[1] == f"{0b11111011:016x}", "sandbox root has more caps"
            code, out = run(sbx, "id -u; grep CapEff /proc/self/status")  # E2B's `user`
            assert out.split()[0] == "1000" and out.split()[2] == "0" * 16, out
            ranges.append(base)
            # From the host: every process of the pod runs under the range, none as root.
            for pid in pod_pids(stack, sbx.sandbox_id):
                for uid in host_uids(pid):
                    assert base <= uid < base + userns.IDS_PER_POD, (pid, uid)
            # Files it writes belong to the range on the host (/workspace is a volume here).
            made = run(sbx, "echo x > /workspace/owned.txt && mkdir -p /workspace/d", user="root")
            assert made[0] == 0, made
            volume = stack.data_dir / "volumes" / "alice" / sbx.sandbox_id / "workspace"
            assert (volume / "owned.txt").stat().st_uid == base
            assert (volume / "d").stat().st_gid == base
        assert ranges[0] != ranges[1], "two sandboxes share a host uid range"
    finally:
        a.kill()
        b.kill()


def test_kernel_knobs_and_namespaces_are_out_of_reach(stack: Stack) -> None:
    sbx = create(stack)
    before = Path("/proc/sys/kernel/core_pattern").read_text()
    try:
        probe = (
            "import os\n"
            "for path in ['/proc/sys/kernel/core_pattern', '/proc/sysrq-trigger',"
            " '/proc/sys/vm/drop_caches', '/proc/sys/kernel/hostname']:\n"
            "    try:\n"
            "        with open(path, 'w') as f: f.write('|/tmp/pwn')\n"
            "        print('WROTE', path)\n"
            "    except OSError as e:\n"
            "        print('refused', path, e.errno)\n"
        )
        code, out = run(sbx, f'python3 -c "{probe}"')
        assert code == 0, out
        assert "WROTE" not in out, out
        assert out.count("refused") == 4, out
        # No mounts, no nested user namespace (which would hand back capabilities).
        assert run(sbx, "mount -t tmpfs none /mnt")[0] != 0
        code, out = run(sbx, "unshare --user --map-root-user true")
        assert code != 0, out
        assert run(sbx, "echo still-fine")[1].strip() == "still-fine"
    finally:
        sbx.kill()
    assert Path("/proc/sys/kernel/core_pattern").read_text() == before


def test_no_host_secret_in_environ_or_etc(stack: Stack) -> None:
    sbx = create(stack)
    try:
        # PID 1 is out of the sandbox's reach (test_pod_descriptors.py); the host reads it.
        code, out = run(sbx, "cat /proc/1/environ", user="root")
        assert code != 0 and "Permission denied" in out, out
        inner = procfs.inner_pid(pod_of(stack, sbx.sandbox_id).pid)
        assert inner is not None
        out = Path(f"/proc/{inner}/environ").read_bytes().decode().replace("\0", "\n")
        names = {line.split("=", 1)[0] for line in out.splitlines() if line}
        assert names <= set(procfs.SPAWN_ENV), f"PID 1 carries the runtime's env: {names}"
        assert "NATS_URL" not in out and "TORPOR" not in out
        # The sandbox's /etc is the rootfs's own: its shadow and sudoers are not the host's.
        for own in ("shadow", "gshadow", "sudoers"):
            inside = run(sbx, f"cat /etc/{own}", user="root")[1]
            host = Path("/etc", own)
            assert not host.exists() or inside != host.read_text(errors="replace"), own
        for secret in ("ssh", "pip.conf", "npmrc"):
            assert run(sbx, f"test -e /etc/{secret}")[0] != 0, f"/etc/{secret} is visible"
        assert run(sbx, "ls -A /etc/ssl/private", user="root")[1].strip() == ""
        passwd = run(sbx, "cat /etc/passwd")[1]
        assert "root:x:0:0:" in passwd
        assert "\nuser:x:1000:1000:" in passwd and ":/home/user:/bin/bash" in passwd
        assert run(sbx, "cat /etc/hostname")[1].strip() == sbx.sandbox_id
        assert run(sbx, "touch /etc/x")[0] != 0, "the pod's /etc is writable"
        # What /usr needs still works: certificates, the linker cache, name lookups.
        tls = (
            "python3 -c 'import ssl; print(len(ssl.create_default_context().get_ca_certs()) >= 0)'"
        )
        assert run(sbx, tls)[1].strip() == "True"
        assert run(sbx, "getent hosts localhost")[0] == 0
    finally:
        sbx.kill()


# ---- the runtime port called directly with hostile values ---------------------------------

HOSTILE_ENVS = [
    {"A": "a\0--ro-bind\0/\0/hostroot"},
    {"B\0--bind": "x"},
    {"C=D": "x"},
    {"": "x"},
]
HOSTILE_NAMES = ["--ro-bind", "../../etc", "a/b", "a\0b", "-", "UPPER", "x" * 64]


@pytest.fixture
async def runtime(nats_url: str, tmp_path: Path) -> AsyncIterator[LocalRuntime]:
    bucket = f"wl_{uuid.uuid4().hex[:12]}"
    os.environ["PODHARD_RUNTIME_CANARY"] = canary = f"secret-{uuid.uuid4().hex}"
    rt = LocalRuntime(
        nats_url=nats_url,
        data_dir=tmp_path / "data",
        bucket=bucket,
        stop_grace=1.0,
        poll_interval=0.2,
    )
    rt.canary = canary  # type: ignore[attr-defined]
    try:
        yield await rt.start()
    finally:
        os.environ.pop("PODHARD_RUNTIME_CANARY", None)
        await rt.close()


async def test_runtime_refuses_hostile_env_and_names(runtime: LocalRuntime, tmp_path: Path) -> None:
    for envs in HOSTILE_ENVS:
        with pytest.raises(RuntimeFailure):
            await runtime.create(
                WorkloadSpec(name=f"h{uuid.uuid4().hex[:8]}", owner="alice", envs=envs)
            )
    for name in HOSTILE_NAMES:
        with pytest.raises(RuntimeFailure):
            await runtime.create(WorkloadSpec(name=name, owner="alice"))
    assert await runtime.list() == []

    # A record changed behind the runtime's back (the bucket is on the network) still cannot
    # smuggle options in: the pod is refused, nothing is mounted.
    name = f"t{uuid.uuid4().hex[:8]}"
    await runtime.create(WorkloadSpec(name=name, owner="alice", replicas=0))
    store: WorkloadStore = runtime._store
    record, revision = await store.get(name)  # type: ignore[misc]
    hostile = record.model_copy(update={"envs": HOSTILE_ENVS[0]})
    await store.put(WorkloadRecord.model_validate(hostile.model_dump()), last=revision)
    await runtime.scale(name, 1)
    with pytest.raises(PodNotReady):
        await runtime.wait_ready(name, timeout=3)
    assert procfs.scan_pods(tmp_path / "data") == []
    assert b"/hostroot" not in b"".join(_all_cmdlines())
    await runtime.delete(name)

    # The runtime keeps working, and its own environment (with a canary) stays outside the pod.
    good = f"g{uuid.uuid4().hex[:8]}"
    await runtime.create(WorkloadSpec(name=good, owner="alice", envs={"OK": "--ro-bind / /x"}))
    ep = await runtime.wait_ready(good, timeout=60)
    [pod] = procfs.scan_pods(tmp_path / "data")
    inner = procfs.inner_pid(pod.pid)  # PID 1: out of the sandbox's reach, read by the host
    assert inner is not None
    environ = Path(f"/proc/{inner}/environ").read_bytes()
    assert runtime.canary.encode() not in environ  # type: ignore[attr-defined]
    assert set(environ.decode().strip("\0").split("\0")) == {
        f"{k}={v}" for k, v in procfs.SPAWN_ENV.items()
    }
    own = await read_file(ep, "/proc/self/environ") or b""
    assert b"OK=--ro-bind / /x" in own  # a value that looks like options is just a value
    assert runtime.canary.encode() not in own  # type: ignore[attr-defined]
    assert [p.workload for p in procfs.scan_pods(tmp_path / "data")] == [good]


def _all_cmdlines() -> list[bytes]:
    out = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                out.append(Path(f"/proc/{entry}/cmdline").read_bytes())
            except OSError:
                continue
    return out
