"""A stored snapshot's retention on a real stack of its own (retention of a few seconds): when it
ends, the snapshotter's NATS schedule fires and the snapshot goes (not listed, not usable, its
files removed from the runtime's data dir). One the owner deleted before is not touched twice."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from e2b import Sandbox
from e2b.exceptions import SandboxException

from tests.support.fixtures import started
from tests.support.stack import SEED_TEMPLATE, Stack

pytestmark = pytest.mark.slow

RETENTION = 8  # seconds


@pytest.fixture(scope="module")
def short_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from started(
        Stack(
            tmp_path_factory.mktemp("snap-retention"),
            templates={"sandbox-base": SEED_TEMPLATE},
            env={"TORPOR_SNAPSHOT_RETENTION_SECONDS": str(RETENTION)},
        )
    )


def test_retention_deletes_snapshot_and_files(short_stack: Stack) -> None:
    env = short_stack.sdk_env("alice")
    opts = {"api_key": env["E2B_API_KEY"], "api_url": env["E2B_API_URL"]}
    opts["sandbox_url"] = env["E2B_SANDBOX_URL"]
    sbx = Sandbox.create(template="base", timeout=120, **opts)
    try:
        sbx.files.write("/home/user/kept.txt", "until retention")
        kept = sbx.create_snapshot().snapshot_id
        early = sbx.create_snapshot().snapshot_id
        store = short_stack.data_dir / "snapshots"
        assert (store / kept / "files").is_dir()
        assert Sandbox.delete_snapshot(early, **opts) is True  # its timer will find nothing

        deadline = time.monotonic() + RETENTION + 60
        while (store / kept).exists() and time.monotonic() < deadline:
            time.sleep(1)
        assert not (store / kept).exists(), "the retention timer did not delete the files"
        assert not (store / early).exists()
        listed = {s.snapshot_id for s in Sandbox.list_snapshots(**opts).next_items()}
        assert kept not in listed
        with pytest.raises(SandboxException) as gone:
            Sandbox.create(kept, **opts)
        assert "404" in str(gone.value)
        assert Sandbox.delete_snapshot(kept, **opts) is False
        deleted = [
            line
            for line in short_stack.log("snapshotter").splitlines()
            if "snapshot_deleted" in line and kept in line
        ]
        assert deleted and all('"retention"' in line for line in deleted), deleted
    finally:
        sbx.kill()
