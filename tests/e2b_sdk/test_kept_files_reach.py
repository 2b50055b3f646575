"""The daemon's ``/kept-files`` from inside a sandbox (code run through the unmodified SDK): no
export (held or not), no thaw and no import without the sandbox's token, and once a process has
run an import is refused even with it, so sandbox code can never have files extracted by the
daemon on its behalf, as root or anyone, into a pod that is already running, nor stop or
continue its sandbox's processes through it."""

from __future__ import annotations

import pytest
from e2b import Sandbox

from tests.support.stack import Stack

pytestmark = pytest.mark.slow


def test_a_sandbox_cannot_use_its_daemons_kept_files(stack: Stack) -> None:
    opts = stack.sdk_opts("alice")
    sbx = Sandbox.create(template="base", timeout=120, **opts)
    try:
        sbx.files.write("/home/user/secret.txt", "mine")
        base = "http://$ip:49983/kept-files"
        probe = sbx.commands.run(
            "ip=$(hostname -I | cut -d' ' -f1); cd /tmp && mkdir -p x/home/user && "
            "printf x > x/home/user/t && tar cf evil.tar -C x home && "
            f"curl -s -o /dev/null -w '%{{http_code}} ' {base}; "
            f"curl -s -o /dev/null -w '%{{http_code}} ' -X POST --data-binary @evil.tar "
            f'"{base}?limit=100000"; '
            f"curl -s -o /dev/null -w '%{{http_code}} ' -H 'X-Access-Token: --ro-bind' {base}; "
            f"curl -s -o /dev/null -w '%{{http_code}} ' \"{base}?hold=600\"; "
            f"curl -s -o /dev/null -w '%{{http_code}} ' -X POST {base}/thaw; "
            f"curl -s -w ' %{{http_code}}' -X POST --data-binary @evil.tar "
            f"-H \"X-Access-Token: $(cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n' "
            f'| sed -n \'s/^ENVD_ACCESS_TOKEN=//p\')" "{base}?limit=100000"'
        )
        codes = probe.stdout.split()
        assert codes[:5] == ["401"] * 5, probe.stdout  # no export, hold or thaw either
        # With a token (the daemon's, if sandbox code could read it): a process has run, so
        # the import is refused (409); without one, 401. Never 200.
        assert codes[-1] in ("401", "409"), probe.stdout
        assert sbx.files.read("/home/user/secret.txt") == "mine"
        assert not sbx.files.exists("/home/user/t")
    finally:
        Sandbox.kill(sbx.sandbox_id, **opts)


def test_an_import_lands_as_the_sandbox_user_and_only_before_a_process(stack: Stack) -> None:
    """What the control plane does on Kubernetes, here on a bubblewrap pod whose daemon is the
    sandbox's root: the import runs as ``user`` (files its, setuid dropped, even for a member
    root owned), once, and never after a process has run."""
    import io
    import tarfile

    import httpx

    opts = stack.sdk_opts("alice")
    sbx = Sandbox.create(template="base", timeout=120, **opts)
    try:
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, mode in (("home/user/imported.txt", 0o644), ("workspace/suid", 0o4755)):
                info = tarfile.TarInfo(name)
                info.size, info.mode, info.uid, info.uname = 2, mode, 0, "root"
                tar.addfile(info, io.BytesIO(b"ok"))
        headers = {
            "E2b-Sandbox-Id": sbx.sandbox_id,
            "E2b-Sandbox-Port": "49983",
            "X-Access-Token": str(sbx._envd_access_token),
        }
        url = f"{stack.proxy_url}/kept-files"
        r = httpx.post(url, params={"limit": "100000"}, content=buf.getvalue(), headers=headers)
        assert r.status_code == 200, r.text
        assert r.json() == {"files": 2, "bytes": 4}
        info = sbx.files.get_info("/home/user/imported.txt")
        assert info.owner == "user"
        assert sbx.files.get_info("/workspace/suid").owner == "user"
        mode = sbx.commands.run("stat -c %a /workspace/suid").stdout.strip()
        assert mode == "755"
        again = httpx.post(url, params={"limit": "100000"}, content=buf.getvalue(), headers=headers)
        assert again.status_code == 409
        assert "fresh pod" in again.json()["message"]
    finally:
        Sandbox.kill(sbx.sandbox_id, **opts)
