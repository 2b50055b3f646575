"""The E2B fidelity yardstick: E2B's own Python SDK test suite, run unmodified against torpor.

Not part of torpor's test suite (it needs E2B's tests, which are not ours to ship, and it takes
tens of minutes on two cores). It

1. exports ``packages/python-sdk/tests`` (and its pytest.ini) from a git copy of e2b-dev/E2B
   (``--mirror``, ``--rev``) or takes an exported ``--tests`` directory, into a scratch directory
   outside every repository;
2. makes a scratch virtualenv with the ``e2b`` SDK and the suite's pytest plugins (never the
   project's .venv: the suite pins its own plugins);
3. starts a private torpor stack (``bench.common.torpor_stack``), or with ``--use-env`` uses the
   one ``eval "$(torpor env)"`` points at;
4. runs pytest on the backend tests (the sandbox and API directories, not the template build,
   volume or offline unit tests) and prints pass/fail counts by file.

    .venv/bin/python bench/e2b_sdk_suite.py                     # private stack, mirror's HEAD
    .venv/bin/python bench/e2b_sdk_suite.py -k files --timeout 60
    eval "$(.venv/bin/torpor env)" && .venv/bin/python bench/e2b_sdk_suite.py --use-env
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import suite_runner  # noqa: E402

MIRROR = Path("/work/.mirror/e2b-dev+E2B/repo")
SUITE = "packages/python-sdk"
BACKEND_DIRS = (
    "tests/sync/api_sync",
    "tests/sync/sandbox_sync",
    "tests/async/api_async",
    "tests/async/sandbox_async",
)
FILES = ("tests", "pytest.ini")
# Tests that dial outside 127.0.0.0/8 (the network rule): curls from a sandbox to public addresses
# (1.1.1.1, 8.8.8.8, gstatic), and `get_host()` URLs `https://{port}-{id}.{domain}`, whose name
# lookup goes to the machine's resolver. Never run; counted as "needs the internet".
OFFLINE_DESELECT = tuple(
    f"tests/{mode}/sandbox_{mode}/{test}"
    for mode in ("sync", "async")
    for test in (
        "test_internet_access.py",
        "test_network.py",
        "test_host.py",
        "test_create.py::test_auto_resume_wakes_on_http_request",
    )
)
SDK_VERSION = "2.63.0"  # the SDK torpor's own tests pin (pyproject.toml)
PLUGINS = (
    f"e2b=={SDK_VERSION}",
    "pytest>=9,<10",
    "pytest-asyncio>=1.3,<2",
    "pytest-timeout>=2.4,<3",
    "python-dotenv>=1,<2",
    "attrs",
)


def export_tests(args: argparse.Namespace, scratch: Path) -> Path:
    if args.tests:
        return Path(args.tests).resolve()
    return suite_runner.export_suite(args.mirror, args.rev, SUITE, scratch)


def ensure_venv(path: Path) -> Path:
    python = path / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(path)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", *PLUGINS], check=True)
    return python


def pytest_args(args: argparse.Namespace) -> list[str]:
    return [
        *(["-k", args.k] if args.k else []),
        *(f"--deselect={t}" for t in OFFLINE_DESELECT),
        *(args.paths or BACKEND_DIRS),
    ]


def summarize(report: Path) -> tuple[int, int, int]:
    per_file: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for classname, _, outcome in suite_runner.outcomes(report):
        per_file[classname.replace(".", "/")][outcome] += 1
    total: collections.Counter[str] = collections.Counter()
    width = max((len(n) for n in per_file), default=10)
    for name in sorted(per_file):
        c = per_file[name]
        total.update(c)
        counts = f"{c['passed']:3d} passed  {c['failed']:3d} failed  {c['skipped']:3d} skipped"
        print(f"{name.ljust(width)}  {counts}")
    print(f"{total['passed']} passed, {total['failed']} failed, {total['skipped']} skipped")
    return total["passed"], total["failed"], total["skipped"]


async def with_stack(python: Path, suite: Path, args: argparse.Namespace) -> Path:
    from tests.support.stack import SERVICES

    # With the template builder (E2B's template tests); its build pods stay offline (the
    # network rule: nothing here dials outside), so steps that download fail.
    return await suite_runner.run_on_private_stack(
        python,
        suite,
        args.timeout,
        pytest_args(args),
        services=(*SERVICES, "builder"),
        env={"TORPOR_BUILDER_ALLOW_INTERNET": "false"},
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mirror", type=Path, default=MIRROR, help="git copy of e2b-dev/E2B")
    p.add_argument("--rev", default="HEAD")
    p.add_argument("--tests", help="an exported packages/python-sdk directory instead")
    p.add_argument(
        "--venv", type=Path, default=Path(tempfile.gettempdir()) / "torpor-e2b-suite-venv"
    )
    p.add_argument("--timeout", type=int, default=60, help="per-test timeout (s)")
    p.add_argument("--use-env", action="store_true", help="use E2B_* from the environment")
    p.add_argument("-k", help="pytest -k expression")
    p.add_argument("paths", nargs="*", help=f"test paths (default: {' '.join(BACKEND_DIRS)})")
    args = p.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the private stack (and its pods) is stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    scratch = Path(tempfile.mkdtemp(prefix="torpor-e2b-suite-"))
    suite = export_tests(args, scratch)
    python = ensure_venv(args.venv)
    if args.use_env:
        report = suite_runner.run_pytest(
            python, suite, suite_runner.env_from_environment(), args.timeout, pytest_args(args)
        )
    else:
        report = asyncio.run(with_stack(python, suite, args))
    summarize(report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
