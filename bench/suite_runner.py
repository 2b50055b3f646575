"""What the runners of E2B's own test suites share (bench/e2b_sdk_suite.py, the core SDK's;
bench/e2b_code_interpreter_suite.py, the Code Interpreter's): export the tests from a git copy,
run pytest on them with a junit report against a stack, read each test's outcome back.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import xml.etree.ElementTree as ET
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

STACK_ENV = ("E2B_API_URL", "E2B_SANDBOX_URL", "E2B_API_KEY")


def export_suite(mirror: Path, rev: str, suite: str, scratch: Path) -> Path:
    """``<suite>/tests`` and ``<suite>/pytest.ini`` of ``rev`` in ``mirror``, under ``scratch``."""
    archive = subprocess.run(
        ["git", "-C", str(mirror), "archive", rev, f"{suite}/tests", f"{suite}/pytest.ini"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(scratch)], input=archive, check=True)
    return scratch / suite


def run_pytest(
    python: Path, suite: Path, env: dict[str, str], timeout: int, args: Sequence[str]
) -> Path:
    """Runs the suite's pytest with ``env`` (no E2B_*/TORPOR_* of ours leak in): its report."""
    report = suite / "report.xml"
    cmd = [
        str(python), "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rN",
        f"--timeout={timeout}", f"--junitxml={report}", *args,
    ]  # fmt: skip
    full_env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "TORPOR_"))}
    full_env.update(env)
    log = suite / "pytest.log"
    with log.open("wb") as out:
        subprocess.run(
            cmd, check=False, cwd=suite, env=full_env, stdout=out, stderr=subprocess.STDOUT
        )
    print(f"pytest output: {log}")
    return report


def env_from_environment() -> dict[str, str]:
    """The stack ``eval "$(torpor env)"`` points at (``--use-env``)."""
    return {k: os.environ[k] for k in STACK_ENV}


async def run_on_private_stack(
    python: Path,
    suite: Path,
    timeout: int,
    args: Sequence[str],
    **stack_options: Any,
) -> Path:
    """``run_pytest`` against a private torpor stack (``bench.common.torpor_stack``)."""
    from bench.common import USER, torpor_stack

    async with torpor_stack(log_level="info", **stack_options) as stack:
        print(f"torpor stack at {stack.api_url} (logs in {stack.root}/logs)")
        env = {
            "E2B_API_URL": stack.api_url,
            "E2B_SANDBOX_URL": stack.proxy_url,
            "E2B_API_KEY": stack.keys[USER],
        }
        return await asyncio.to_thread(run_pytest, python, suite, env, timeout, args)


def outcomes(report: Path) -> Iterator[tuple[str, str, str]]:
    """(classname, name, "passed" | "failed" | "skipped") of each test case in a junit report."""
    for case in ET.parse(report).getroot().iter("testcase"):
        outcome = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                outcome = "failed"
            elif child.tag == "skipped":
                outcome = "skipped"
        yield case.get("classname") or "", case.get("name") or "", outcome
