"""The daemon imports nothing a sandbox can plant or name, from inside a real sandbox.

The daemon starts again on every resume (a files-only pause replays its processes) in the
sandbox's kept root, so what sandbox root writes before a pause is there when it starts. Before:
the daemon ran as ``python -c …`` with the pod's environment (the template's and the create
request's variables) and its working folder first on its module path, so a ``sitecustomize.py``
in that folder, in a ``PYTHONPATH`` the request named, or in root's user site folder ran inside
the daemon (which holds the access token) at its next start. ``-I`` (pod_commands.daemon_flags)
closes all three."""

from __future__ import annotations

import shlex
import sys

import pytest
from e2b import Sandbox

from tests.security.pod_support import run
from tests.support.stack import Stack

pytestmark = pytest.mark.slow

PLANTED = "/home/user/plant"
VERSION = f"python{sys.version_info.major}.{sys.version_info.minor}"
# Where each planted module would be found: the daemon's working folder, a PYTHONPATH entry, the
# user site folders of root and of `user` (for either HOME).
PLACES = [
    "/home/user",
    PLANTED,
    f"/root/.local/lib/{VERSION}/site-packages",
    f"/home/user/.local/lib/{VERSION}/site-packages",
    "/workspace",
]


def test_a_module_planted_before_a_pause_never_runs_in_the_daemon(stack: Stack) -> None:
    opts = stack.sdk_opts("alice")
    sbx = Sandbox.create(
        template="sandbox-base",
        timeout=300,
        envs={"PYTHONPATH": PLANTED, "PYTHONSTARTUP": f"{PLANTED}/sitecustomize.py"},
        **opts,
    )
    try:
        module = "open('/home/user/ran-%d', 'w').write(__file__)\n"
        script = "".join(
            f"mkdir -p {place}\n"
            f"printf %s {shlex.quote(module % i)} > {place}/sitecustomize.py\n"
            f"cp {place}/sitecustomize.py {place}/usercustomize.py\n"
            for i, place in enumerate(PLACES)
        )
        sbx.files.write("/tmp/plant.sh", script)
        code, out = run(sbx, "sudo sh -e /tmp/plant.sh && echo planted")
        assert code == 0 and "planted" in out, out
        sbx.pause()
        resumed = Sandbox.connect(sbx.sandbox_id, **opts)
        code, out = run(resumed, "echo alive; ls /home/user | grep '^ran-' || true")
        assert code == 0 and out.startswith("alive"), out
        assert "ran-" not in out, f"a planted module ran at the daemon's start: {out}"
        # The sandbox's own Python still honours the request's PYTHONPATH: only the daemon
        # ignores it.
        code, out = run(resumed, "python3 -c 'import sys; print(sys.path[1])'")
        assert code == 0 and out.strip() == PLANTED, out
    finally:
        Sandbox.kill(sbx.sandbox_id, **opts)
