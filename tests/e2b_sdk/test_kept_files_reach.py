"""The daemon's ``/kept-files`` from inside a sandbox (code run through the unmodified SDK): no
export and no import without the sandbox's token, and once a process has run an import is
refused even with it, so sandbox code can never have files extracted by the daemon on its
behalf, as root or anyone, into a pod that is already running."""

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
            f"curl -s -w ' %{{http_code}}' -X POST --data-binary @evil.tar "
            f"-H \"X-Access-Token: $(cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n' "
            f'| sed -n \'s/^ENVD_ACCESS_TOKEN=//p\')" "{base}?limit=100000"'
        )
        codes = probe.stdout.split()
        assert codes[:3] == ["401", "401", "401"], probe.stdout
        # With a token (the daemon's, if sandbox code could read it): a process has run, so
        # the import is refused (409); without one, 401. Never 200.
        assert codes[-1] in ("401", "409"), probe.stdout
        assert sbx.files.read("/home/user/secret.txt") == "mine"
        assert not sbx.files.exists("/home/user/t")
    finally:
        Sandbox.kill(sbx.sandbox_id, **opts)
