"""The compiled data path's own Go tests (``services/proxy/wire/*_test.go``): its strict head
parser against hostile request and response heads (NUL, bare CR/LF, obs-fold, bad framing,
over-limit header counts), Content-Length parsing and the JSON error body's quoting, plus a
short fuzz run of the request parser."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from services.proxy.wire_build import SOURCE


def _go() -> str:
    go = shutil.which("go")
    if go is None:
        if os.environ.get("CI") == "true":
            pytest.fail("go is not installed (CI builds the proxy's data path with it)")
        pytest.skip("go is not installed: the proxy relays everything in Python here")
    return go


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": "local", "GOFLAGS": ""}
    return subprocess.run(
        [_go(), *args],
        cwd=SOURCE,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_the_go_tests_pass() -> None:
    done = _run("test", "-count=1", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]


def test_a_short_fuzz_run_of_the_request_parser_finds_nothing() -> None:
    done = _run(
        "test",
        "-run",
        "^$",
        "-fuzz",
        "^FuzzParseRequest$",
        "-fuzztime",
        "10s",
        "-parallel",
        "1",
        ".",
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
