"""The kept-files store (``shared.bus.kept_files``) on a real nats-server: round trip, replace,
delete, the per-object limit and the bucket's bound (a refused put leaves the old object), and
object names only from validated ids."""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import AsyncIterator, Iterator

import nats
import pytest

from shared.bus.kept_files import NatsKeptFiles
from shared.bus.server import EmbeddedNats
from shared.bus.topology import OBJ_KEPT_FILES, ensure_kept_files
from shared.errors import SnapshotTooLarge, Unavailable
from shared.ports.kept_files import KeptKey

BUCKET_BYTES = 3 * 1024 * 1024


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedNats]:
    nats_server = EmbeddedNats(data_dir=tmp_path_factory.mktemp("kept-nats")).start()
    yield nats_server
    nats_server.stop()


@pytest.fixture
async def store(server: EmbeddedNats) -> AsyncIterator[NatsKeptFiles]:
    nc = await nats.connect(server.url)
    await ensure_kept_files(nc.jetstream(), replicas=1, max_bytes=BUCKET_BYTES)
    await nc.close()
    kept = NatsKeptFiles.connecting(server.url)
    yield kept
    await kept.close()


def _file(data: bytes) -> io.BufferedRandom:
    fh = tempfile.TemporaryFile()
    fh.write(data)
    fh.seek(0)
    return fh  # type: ignore[return-value]


async def _read(store: NatsKeptFiles, key: KeptKey) -> bytes | None:
    with tempfile.TemporaryFile() as out:
        if not await store.get(key, out):  # type: ignore[arg-type]
            return None
        out.seek(0)
        return out.read()


async def test_put_get_replace_delete(store: NatsKeptFiles) -> None:
    key = KeptKey.sandbox("ikept1")
    first, second = os.urandom(300_000), os.urandom(200_000)
    assert await store.put(key, _file(first), limit=1 << 20) == len(first)  # type: ignore[arg-type]
    assert await _read(store, key) == first
    await store.put(key, _file(second), limit=1 << 20)  # type: ignore[arg-type]
    assert await _read(store, key) == second
    other = KeptKey.snapshot("snap-" + "a" * 20)
    assert await _read(store, other) is None
    await store.delete(key)
    await store.delete(key)  # idempotent
    assert await _read(store, key) is None


async def test_over_the_limit_stores_nothing_and_keeps_the_old(store: NatsKeptFiles) -> None:
    key = KeptKey.sandbox("ikept2")
    await store.put(key, _file(b"old"), limit=100)  # type: ignore[arg-type]
    with pytest.raises(SnapshotTooLarge, match="over the limit"):
        await store.put(key, _file(b"x" * 101), limit=100)  # type: ignore[arg-type]
    assert await _read(store, key) == b"old"
    await store.delete(key)


async def test_a_full_bucket_refuses_and_keeps_the_old(store: NatsKeptFiles) -> None:
    key = KeptKey.sandbox("ikept3")
    await store.put(key, _file(b"old"), limit=1 << 30)  # type: ignore[arg-type]
    with pytest.raises(Unavailable, match="refused"):
        await store.put(key, _file(os.urandom(BUCKET_BYTES + 1)), limit=1 << 30)  # type: ignore[arg-type]
    assert await _read(store, key) == b"old"
    await store.delete(key)


async def test_an_unreachable_bucket_is_unavailable(server: EmbeddedNats) -> None:
    kept = NatsKeptFiles.connecting(server.url, bucket="torpor_no_such_bucket")
    try:
        with pytest.raises(Unavailable, match="not reachable"):
            await kept.get(KeptKey.sandbox("ikept4"), io.BytesIO())  # type: ignore[arg-type]
    finally:
        await kept.close()


@pytest.mark.parametrize(
    "bad",
    ["", "../ikept", "a.b", "a/b", "x\x00y", "--ro-bind", "A" * 70, "$O.x", "*", ">", "snap-x"],
)
def test_keys_come_only_from_valid_ids(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid"):
        KeptKey.sandbox(bad if bad != "snap-x" else "snap.x")
    with pytest.raises(ValueError, match="invalid"):
        KeptKey.snapshot(bad)
    assert KeptKey.sandbox("ikept5").name == "sandbox.ikept5"
    assert OBJ_KEPT_FILES == "torpor_kept_files"
