"""API keys over real NATS KV: create, list, revoke, authenticate; secrets never stored in clear."""

from __future__ import annotations

import re
import subprocess

import nats
import pytest

from shared.auth.keys import KvApiKeys, KvUsers, hash_secret
from shared.bus.kv import NatsBucket
from shared.bus.server import EmbeddedNats
from shared.bus.topology import KV_API_KEYS, KV_USERS, ensure_topology
from shared.errors import NotFound
from tests.support.env import torpor


async def _all_stored_bytes(js: object, bucket: str) -> list[bytes]:
    """Every message ever written to the bucket's stream (history included)."""
    info = await js.stream_info(f"KV_{bucket}")  # type: ignore[attr-defined]
    out = []
    for seq in range(info.state.first_seq, info.state.last_seq + 1):
        try:
            msg = await js.get_msg(f"KV_{bucket}", seq)  # type: ignore[attr-defined]
        except nats.js.errors.NotFoundError:
            continue
        out.append((msg.subject or "").encode() + b"\n" + (msg.data or b""))
    return out


async def test_keys_lifecycle_and_no_clear_secrets(fresh_nats: EmbeddedNats) -> None:
    nc = await nats.connect(fresh_nats.url)
    try:
        js = nc.jetstream()
        await ensure_topology(js)
        users = KvUsers(NatsBucket(await js.key_value(KV_USERS)))
        keys = KvApiKeys(NatsBucket(await js.key_value(KV_API_KEYS)), users)

        alice_id, alice_secret = await keys.create("alice")
        root_id, root_secret = await keys.create("root", admin=True)
        assert alice_secret != root_secret
        assert (u := await keys.authenticate(alice_secret)) is not None
        assert u.name == "alice"
        assert not u.admin
        assert (r := await keys.authenticate(root_secret)) is not None
        assert r.admin
        assert await keys.authenticate("torpor_" + "0" * 48) is None
        assert await keys.authenticate("") is None

        listed = {k.key_id: k for k in await keys.list()}
        assert set(listed) == {alice_id, root_id}
        assert listed[alice_id].user == "alice"
        assert listed[alice_id].revoked_at is None

        revoked = await keys.revoke(alice_id)
        assert revoked.revoked_at is not None
        assert await keys.authenticate(alice_secret) is None
        assert await keys.authenticate(root_secret) is not None
        with pytest.raises(NotFound):
            await keys.revoke("key_doesnotexist")

        for bucket in (KV_API_KEYS, KV_USERS):
            for blob in await _all_stored_bytes(js, bucket):
                for secret in (alice_secret, root_secret):
                    assert secret.encode() not in blob
                    assert secret[4:].encode() not in blob  # not even without the prefix
        # Stored under the hash, as promised.
        assert await NatsBucket(await js.key_value(KV_API_KEYS)).get(hash_secret(root_secret))
    finally:
        await nc.close()


def _torpor(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return torpor("keys", *args, "--nats-url", url)


async def test_keys_cli(fresh_nats: EmbeddedNats) -> None:
    created = _torpor("create", "carol", "--admin", url=fresh_nats.url)
    assert created.returncode == 0, created.stderr
    secret = created.stdout.strip()
    assert re.fullmatch(r"e2b_[0-9a-f]{40}", secret), "the E2B key format every SDK accepts"
    key_id = next(
        line.split()[-1] for line in created.stderr.splitlines() if line.startswith("key id")
    )

    listed = _torpor("list", url=fresh_nats.url)
    assert listed.returncode == 0, listed.stderr
    assert key_id in listed.stdout
    assert "carol (admin)" in listed.stdout
    assert secret not in listed.stdout

    nc = await nats.connect(fresh_nats.url)
    try:
        js = nc.jetstream()
        users = KvUsers(NatsBucket(await js.key_value(KV_USERS)))
        keys = KvApiKeys(NatsBucket(await js.key_value(KV_API_KEYS)), users)
        assert (await keys.authenticate(secret)) is not None
        revoked = _torpor("revoke", key_id, url=fresh_nats.url)
        assert revoked.returncode == 0, revoked.stderr
        assert await keys.authenticate(secret) is None
    finally:
        await nc.close()
    missing = _torpor("revoke", "key_nope", url=fresh_nats.url)
    assert missing.returncode == 1
    assert "no API key" in missing.stderr
