"""Running ``ip`` and ``nft``: one place that spawns them and turns failures into torpor errors."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass

from shared.errors import RuntimeFailure

INSTALL_HINT = "install iproute2 and nftables (`apt-get install -y iproute2 nftables`), as root"


@dataclass(frozen=True)
class Result:
    returncode: int
    stdout: str
    stderr: str


async def run(argv: Sequence[str], *, stdin: str | None = None, check: bool = True) -> Result:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE if stdin is not None else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
    except OSError as e:
        msg = f"cannot run {argv[0]} ({e.strerror}): {INSTALL_HINT}"
        raise RuntimeFailure(msg) from e
    out, err = await proc.communicate(stdin.encode() if stdin is not None else None)
    result = Result(
        proc.returncode or 0, out.decode(errors="replace"), err.decode(errors="replace")
    )
    if check and result.returncode != 0:
        msg = f"{' '.join(argv[:3])} failed: {_first_line(result.stderr)}"
        raise RuntimeFailure(msg)
    return result


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[0][:300] if lines else "no output"
