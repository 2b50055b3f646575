"""Templates users build (E2B's template API), local runtime, with the unmodified ``e2b`` SDK:

- cold build: a typical template (a copied folder of packages, a ``dpkg -i`` of a .deb, a
  ``pip install`` of a wheel with ``--no-index``, a copied file, a RUN, start and ready
  commands), with a fresh first step each round so nothing is cached;
- cached rebuild: the same template again (every layer cached);
- one-step rebuild: the last RUN changed (every earlier layer cached);
- create: ``Sandbox.create(name)`` until the SDK returns (the ready command succeeded).

A private stack (``bench.common.torpor_stack``) with the builder; build pods offline
(``TORPOR_BUILDER_ALLOW_INTERNET=false``: nothing is downloaded, everything comes from the build
context). Figures are wall-clock seconds as the SDK sees them, on whatever load the machine has.

    .venv/bin/python bench/template_bench.py [--rounds 3] [--creates 5]
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from common import STATS_HEADERS, loadavg, stats_row, summary, table, torpor_stack, write_result

from tests.support.packages import build_deb, write_wheel
from tests.support.stack import SERVICES


def _context(folder: Path) -> None:
    pkgs = folder / "pkgs"
    pkgs.mkdir(parents=True)
    dist = "bench_demo-1.0.dist-info"
    files = {
        "bench_demo/__init__.py": "X = 1\n",
        f"{dist}/METADATA": "Metadata-Version: 2.1\nName: bench-demo\nVersion: 1.0\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/RECORD": "",
    }
    write_wheel(pkgs / "bench_demo-1.0-py3-none-any.whl", files)
    build_deb(
        pkgs / "bench-hello.deb",
        folder / "debroot",
        "Package: bench-hello\nVersion: 1.0\nArchitecture: all\n"
        "Maintainer: bench <b@example.invalid>\nDescription: bench\n",
        {"usr/share/bench-hello/hello": "hello\n"},
    )
    (folder / "app.txt").write_text("app\n")


def _template(folder: Path, first: str, last: str) -> Any:
    from e2b import Template

    return (
        Template(file_context_path=str(folder))
        .from_debian_image()
        .run_cmd(f"echo {first} > /home/user/first.txt")
        .copy("pkgs/", "/opt/pkgs/")
        .run_cmd("dpkg -i /opt/pkgs/bench-hello.deb", user="root")
        .pip_install(["--no-index", "--find-links=/opt/pkgs", "bench-demo"])
        .copy("app.txt", "/home/user/app.txt")
        .run_cmd(f"echo {last} > /home/user/last.txt")
        .set_start_cmd("sleep infinity", "test -f /home/user/app.txt")
    )


def _build(template: Any, name: str, api: dict[str, str]) -> float:
    from e2b import Template

    started = time.monotonic()
    Template.build(template, name, **api)
    return time.monotonic() - started


async def run(rounds: int, creates: int) -> dict[str, object]:
    from e2b import Sandbox

    cold: list[float] = []
    cached: list[float] = []
    one_step: list[float] = []
    create: list[float] = []
    with tempfile.TemporaryDirectory(prefix="torpor-template-bench-") as scratch:
        folder = Path(scratch)
        _context(folder)
        async with torpor_stack(
            services=(*SERVICES, "builder"), env={"TORPOR_BUILDER_ALLOW_INTERNET": "false"}
        ) as stack:
            api = {"api_key": stack.keys["bench"], "api_url": stack.api_url}
            name = f"bench-{uuid.uuid4().hex[:8]}"
            for i in range(rounds):
                first = uuid.uuid4().hex
                for last, out in (("a", cold), ("a", cached), (f"b{i}", one_step)):
                    template = _template(folder, first, last)
                    out.append(await asyncio.to_thread(_build, template, name, api))
            opts = {**api, "sandbox_url": stack.proxy_url}
            for _ in range(creates):
                started = time.monotonic()
                sbx = await asyncio.to_thread(Sandbox.create, name, **opts)
                create.append(time.monotonic() - started)
                await asyncio.to_thread(sbx.kill)
    return {
        "cold_build": summary(cold),
        "cached_rebuild": summary(cached),
        "one_step_rebuild": summary(one_step),
        "create_from_template": summary(create),
        "load": loadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--creates", type=int, default=5)
    args = parser.parse_args()
    result = asyncio.run(run(args.rounds, args.creates))
    rows = [
        stats_row(label, result[key])  # type: ignore[arg-type]
        for label, key in (
            ("cold build", "cold_build"),
            ("cached rebuild", "cached_rebuild"),
            ("rebuild, last step changed", "one_step_rebuild"),
            ("Sandbox.create from template", "create_from_template"),
        )
    ]
    print(table(STATS_HEADERS, rows))
    print(f"wrote {write_result('template_bench', result)}")


if __name__ == "__main__":
    main()
