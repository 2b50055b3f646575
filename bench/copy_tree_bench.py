"""The beneath-the-root copy (``shared/runtime/local/beneath.copy_tree``, used for kept files,
RUN-step layers and snapshots) against the ``cp -a`` it replaced, on one tree.

    .venv/bin/python bench/copy_tree_bench.py [--tree PATH] [--rounds 5]

Each round copies ``--tree`` (default: the sandbox rootfs's ``usr``, about 10 000 entries) into a
fresh folder beside the results, once with ``cp -a --reflink=auto --sparse=always`` (what
snapshot_files ran) and once with ``copy_tree``; the page cache is warm after the first round.
Writes ``bench/results/copy_tree.json``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from common import STATS_HEADERS, bench_parser, save_result, stats_row, summary, table

from shared.runtime.local import beneath

DEFAULT_TREE = Path.home() / ".cache/torpor/rootfs/current/usr"


def _entries(tree: Path) -> int:
    return sum(len(dirs) + len(files) for _, dirs, files in os.walk(tree))


def main() -> None:
    parser = bench_parser(__doc__, out="copy_tree")
    parser.add_argument("--tree", type=Path, default=DEFAULT_TREE)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tree: Path = args.tree
    times: dict[str, list[float]] = {"cp -a": [], "copy_tree": []}
    with tempfile.TemporaryDirectory(prefix="copy-tree-bench-") as scratch:
        for _ in range(args.rounds):
            for how, seconds in times.items():
                dest = Path(scratch) / "dest"
                shutil.rmtree(dest, ignore_errors=True)
                dest.mkdir()
                start = time.perf_counter()
                if how == "cp -a":
                    argv = ["cp", "-a", "--reflink=auto", "--sparse=always", "--", f"{tree}/."]
                    subprocess.run([*argv, str(dest)], check=True)
                else:
                    with beneath.Dir.open(tree) as src, beneath.Dir.open(dest) as dst:
                        beneath.copy_tree(src, dst)
                seconds.append(time.perf_counter() - start)
    stats = {how: summary(seconds) for how, seconds in times.items()}
    print(f"{tree}: {_entries(tree)} entries")
    print(table(STATS_HEADERS, [stats_row(how, s) for how, s in stats.items()]))
    save_result(args.out, {"tree": str(tree), "entries": _entries(tree), "copies": stats})


if __name__ == "__main__":
    main()
