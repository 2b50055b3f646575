"""From inside a sandbox, through the unmodified e2b SDK against a real stack: the Debian rootfs
and its passwordless ``sudo`` give the sandbox's root and nothing more. Root in a sandbox is an
unprivileged host id range with capabilities over its own namespaces only: host files, the
runtime's data dir (other sandboxes' kept layers), the shared rootfs and host uid 0 stay out of
reach; a sandbox's kept files are deleted with it; the sudo socket refuses malformed requests."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest

from shared.runtime.local import rootfs, userns
from tests.security.pod_support import create, host_uids, pod_pids, run
from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def _root(sbx: object, cmd: str) -> tuple[int, str]:
    return run(sbx, f"sudo sh -c {json.dumps(cmd)}")  # type: ignore[arg-type]


def test_sudo_root_stays_inside_the_sandbox(stack: Stack, tmp_path: Path) -> None:
    secret = tmp_path / f"host-secret-{uuid.uuid4().hex}"
    secret.write_text("host only")
    secret.chmod(0o644)
    a, b = create(stack), create(stack)
    try:
        assert run(a, "echo mark-of-a > /home/user/mark-a.txt")[0] == 0
        code, out = _root(b, "id -u; cat /proc/self/uid_map")
        assert code == 0, out
        uid, mapping = out.splitlines()[:2]
        inside, base, count = (int(x) for x in mapping.split())
        assert (uid, inside, count) == ("0", 0, userns.IDS_PER_POD)
        assert base >= userns.FIRST_BASE, "sudo root is host root"
        # Host files, the data dir with every sandbox's layer, the shared rootfs: not there.
        layers = stack.data_dir / "layers"
        assert (layers / a.sandbox_id).is_dir()
        for path in (secret, layers, layers / a.sandbox_id, rootfs.locate(), stack.root):
            code, out = _root(b, f"ls -d {path} 2>/dev/null || echo absent")
            assert out.strip().endswith("absent"), (path, out)
        code, out = _root(b, "grep -rl mark-of-a / --exclude-dir=proc --exclude-dir=sys || true")
        assert "mark-a" not in out, out
        # No capability beyond its namespaces: no mounts, no nested user namespace, no raw
        # devices, read-only code of the daemon.
        assert _root(b, "mount -t tmpfs none /mnt")[0] != 0
        assert _root(b, "unshare --user --map-root-user true")[0] != 0
        assert _root(b, "mknod /tmp/sda b 8 0")[0] != 0
        envd = Path(__import__("services.envd", fromlist=["x"]).__file__).parent
        assert _root(b, f"touch {envd}/pwned.py")[0] != 0
        assert not (envd / "pwned.py").exists()
        # The shared rootfs is read-only underneath: root's change lands in b's layer only.
        assert _root(b, "echo changed > /etc/motd")[0] == 0
        assert run(a, "cat /etc/motd")[1].strip() != "changed"
        assert (rootfs.locate() / "etc" / "motd").read_text().strip() != "changed"
        # From the host: every process of b (sudo's command included) runs in b's range.
        assert run(b, "sudo sleep 30 >/dev/null 2>&1 &")[0] == 0
        time.sleep(0.5)
        for pid in pod_pids(stack, b.sandbox_id):
            for host_uid in host_uids(pid):
                assert base <= host_uid < base + userns.IDS_PER_POD, (pid, host_uid)
    finally:
        a.kill()
        b.kill()


def test_kept_files_are_deleted_with_the_sandbox(stack: Stack) -> None:
    sbx = create(stack)
    layer = stack.data_dir / "layers" / sbx.sandbox_id
    assert run(sbx, "echo kept > /home/user/kept.txt")[0] == 0
    sbx.pause()
    assert layer.is_dir(), "a paused sandbox keeps its layer"
    sbx.kill()
    deadline = time.monotonic() + 60
    while layer.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not layer.exists(), "the killed sandbox's kept files are still on the host"


HOSTILE_REQUESTS = [
    b"{}\n",  # no descriptors
    b"not json\n",
    b'{"user": "root", "argv": ["--ro-bind", "/", "/"]}\n',
    b'{"user": "root\\u0000x", "argv": ["id"], "env": {}, "cwd": "/"}\n',
    b'{"user": "nobody-here", "argv": ["id"], "env": {}, "cwd": "/"}\n',
    b"x" * (2 * 1024 * 1024),
]


def test_sudo_socket_refuses_malformed_requests(stack: Stack) -> None:
    sbx = create(stack)
    try:
        for request in HOSTILE_REQUESTS:
            sbx.files.write("/tmp/request.bin", request)
            probe = (
                "import socket\n"
                "s = socket.socket(socket.AF_UNIX)\n"
                "s.connect('/run/torpor/sudo.sock')\n"
                "try:\n"
                "    s.sendall(open('/tmp/request.bin', 'rb').read())\n"
                "    s.shutdown(socket.SHUT_WR)\n"
                "except OSError:\n"
                "    pass  # the daemon stopped reading (too large)\n"
                "try:\n"
                "    print(s.recv(4096).decode() or 'CLOSED')\n"
                "except OSError:\n"
                "    print('CLOSED')\n"
            )
            sbx.files.write("/tmp/probe.py", probe)
            code, out = run(sbx, "python3 /tmp/probe.py")
            assert code == 0, out
            assert '"exit"' not in out, (request[:60], out)
            assert '"error"' in out or (len(request) > 2**20 and "CLOSED" in out), out
        # The socket still serves well-formed requests afterwards.
        assert run(sbx, "sudo id -u")[1].strip() == "0"
    finally:
        sbx.kill()
