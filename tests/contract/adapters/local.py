"""The local adapter under the contract suite: a LocalRuntime with its own bucket and data dir."""

from __future__ import annotations

import shutil
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from shared.runtime.local import LocalRuntime
from tests.conftest import skip_or_fail
from tests.contract.harness import HarnessContext, RuntimeHarness

TEMPLATES = Path(__file__).resolve().parents[1] / "templates"


@asynccontextmanager
async def harness(context: HarnessContext) -> AsyncIterator[RuntimeHarness]:
    if shutil.which("bwrap") is None:
        skip_or_fail("bubblewrap (bwrap) is not installed")
    runtime = LocalRuntime(
        nats_url=context.nats_url,
        data_dir=context.tmp_path / "local-runtime",
        templates_dir=TEMPLATES,
        bucket=f"wl_{uuid.uuid4().hex[:12]}",
        stop_grace=1.0,
    )
    await runtime.start()
    try:
        yield RuntimeHarness(runtime=runtime, never_ready_template="sandbox-never-ready")
    finally:
        await runtime.close()
