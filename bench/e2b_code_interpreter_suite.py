"""E2B's Code Interpreter Python test suite (``python/tests`` of e2b-dev/code-interpreter), run
unmodified against torpor with the unmodified ``e2b-code-interpreter`` SDK from PyPI.

Like ``bench/e2b_sdk_suite.py`` (the core SDK's suite): it exports the tests from a git copy
(``--mirror``, ``--rev``) into a scratch directory outside every repository, makes a scratch
virtualenv with the SDK and the suite's pytest plugins, starts a private torpor stack (or uses
``E2B_*`` from the environment with ``--use-env``), runs pytest with a per-test timeout and
prints pass/fail counts by file; ``--json FILE`` writes every test's outcome.
``EXPECTED_FAILURES`` says why each test torpor does not pass fails (docs/e2b-compatibility.md);
tests/e2b_sdk/test_code_interpreter_suite.py runs this and checks nothing else fails.

    .venv/bin/python bench/e2b_code_interpreter_suite.py
    .venv/bin/python bench/e2b_code_interpreter_suite.py -k env_vars
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import suite_runner  # noqa: E402
from shared.runtime.local.cached_layers import cache_dir  # noqa: E402

MIRROR = Path("/work/.mirror/e2b-dev+code-interpreter/repo")
SUITE = "python"
SDK = "e2b-code-interpreter==2.11.5"
PLUGINS = (
    SDK,
    "e2b==2.63.0",
    "pytest>=9,<10",
    "pytest-asyncio>=1.3,<2",
    "pytest-timeout>=2.4,<3",
    "pytest-xdist>=3,<4",  # the suite's pytest.ini asks for --numprocesses=2
    "python-dotenv>=1,<2",
)
# The javascript/typescript kernel (Deno's), when the code-interpreter-deno layer has it: that
# layer needs npm on the build host (scripts/build-code-interpreter.sh).
DENO = cache_dir() / "code-interpreter-deno/current/tree/opt/torpor/deno/deno"
_NO_DENO = "no javascript kernel: the code-interpreter-deno layer needs npm to build"
_NEEDS_DENO = (
    "env_vars.test_js::",
    "::test_cwd_javascript",
    "::test_cwd_typescript",
    "::test_js_",
    "::test_ts_kernel",
    "::test_list_contexts",  # they expect a default javascript context
)
# The R and Java kernels' specs, in the code-interpreter-r and -java layers (Debian's packages;
# the template does not start without those layers, so a missing spec is a layer built before
# they had it).
_SPECS = "current/tree/opt/torpor/venv/share/jupyter/kernels"
R_KERNEL = cache_dir() / f"code-interpreter-r/{_SPECS}/ir/kernel.json"
JAVA_KERNEL = cache_dir() / f"code-interpreter-java/{_SPECS}/java/kernel.json"
_NEEDS_R = ("env_vars.test_r::", "::test_cwd_r", "::test_r_kernel")
_NEEDS_JAVA = ("env_vars.test_java::", "::test_cwd_java", "::test_java_kernel")
# How many of the suite's tests need each (tests/e2b_sdk/test_code_interpreter_suite.py).
NEEDS_COUNT = {"deno": 22, "r": 9, "java": 9}
# Substrings of test ids ("<module>::<test>") -> why they may fail here
# (docs/e2b-compatibility.md, "Code Interpreter").
EXPECTED_FAILURES = {
    **({} if DENO.is_file() else dict.fromkeys(_NEEDS_DENO, _NO_DENO)),
    **({} if R_KERNEL.is_file() else dict.fromkeys(_NEEDS_R, f"no R kernel ({R_KERNEL})")),
    **(
        {}
        if JAVA_KERNEL.is_file()
        else dict.fromkeys(_NEEDS_JAVA, f"no Java kernel ({JAVA_KERNEL})")
    ),
}


def ensure_venv(path: Path) -> Path:
    python = path / "bin" / "python"
    if not python.exists():
        uv = REPO / ".venv" / "bin" / "uv"
        subprocess.run([str(uv), "venv", "-q", "--python", sys.executable, str(path)], check=True)
    uv = REPO / ".venv" / "bin" / "uv"
    subprocess.run([str(uv), "pip", "install", "-q", "--python", str(python), *PLUGINS], check=True)
    return python


def expected_reason(test: str) -> str | None:
    for needle, why in EXPECTED_FAILURES.items():
        if needle in test:
            return why
    return None


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mirror", type=Path, default=MIRROR)
    p.add_argument("--rev", default="HEAD")
    p.add_argument(
        "--venv", type=Path, default=Path(tempfile.gettempdir()) / "torpor-ci-suite-venv"
    )
    p.add_argument("--timeout", type=int, default=120, help="per-test timeout (s)")
    p.add_argument("--use-env", action="store_true", help="use E2B_* from the environment")
    p.add_argument("--json", type=Path, help="write {test: outcome} here")
    p.add_argument("-k", help="pytest -k expression")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scratch = Path(tempfile.mkdtemp(prefix="torpor-ci-suite-"))
    suite = suite_runner.export_suite(args.mirror, args.rev, SUITE, scratch)
    python = ensure_venv(args.venv)
    pytest_args = [*(["-k", args.k] if args.k else []), "tests"]
    if args.use_env:
        report = suite_runner.run_pytest(
            python, suite, suite_runner.env_from_environment(), args.timeout, pytest_args
        )
    else:
        report = asyncio.run(
            suite_runner.run_on_private_stack(python, suite, args.timeout, pytest_args)
        )
    found = {f"{cls}::{name}": outcome for cls, name, outcome in suite_runner.outcomes(report)}
    passed = sum(1 for o in found.values() if o == "passed")
    failed = sorted(t for t, o in found.items() if o == "failed")
    for test in failed:
        print(f"FAILED {test}: {expected_reason(test) or 'NOT EXPECTED'}")
    print(f"{passed} passed, {len(failed)} failed of {len(found)}")
    if args.json:
        args.json.write_text(json.dumps(found, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
