"""E2B-format API keys: new keys are ``e2b_<40 lowercase hex>``, which e2b SDK 2.25-2.45 insist
on client-side; keys issued earlier as ``torpor_<hex>`` keep working."""

from __future__ import annotations

import os
import re
import subprocess
import textwrap

import httpx
import nats

from shared.auth.keys import KvApiKeys, KvUsers, hash_secret, new_secret
from shared.auth.models import ApiKeyRecord
from shared.bus.kv import NatsBucket
from shared.bus.server import EmbeddedNats
from shared.bus.topology import KV_API_KEYS, KV_USERS, ensure_topology
from tests.conftest import skip_or_fail
from tests.security.pinned_sdk import pinned_sdk_python
from tests.support.stack import Stack

E2B_KEY = re.compile(r"e2b_[0-9a-f]{40}")
PINNED = "2.45.1"  # the last SDK release that validates the key format client-side

SCRIPT = textwrap.dedent(
    """
    import importlib.metadata, sys
    from e2b import Sandbox
    assert importlib.metadata.version("e2b") == sys.argv[1], importlib.metadata.version("e2b")
    sbx = Sandbox.create(timeout=120)
    print("created", sbx.sandbox_id, flush=True)
    sbx.kill()
    print("killed", flush=True)
    """
)


def test_new_secrets_have_the_e2b_format() -> None:
    secrets = {new_secret() for _ in range(50)}
    assert len(secrets) == 50
    assert all(E2B_KEY.fullmatch(s) for s in secrets), secrets


async def test_legacy_torpor_keys_still_authenticate(fresh_nats: EmbeddedNats) -> None:
    nc = await nats.connect(fresh_nats.url)
    try:
        js = nc.jetstream()
        await ensure_topology(js)
        users = KvUsers(NatsBucket(await js.key_value(KV_USERS)))
        bucket = NatsBucket(await js.key_value(KV_API_KEYS))
        keys = KvApiKeys(bucket, users)
        _, fresh = await keys.create("dave")
        assert E2B_KEY.fullmatch(fresh)
        # A key issued before the format changed: stored the same way, under its hash.
        legacy = "torpor_" + "ab" * 24
        record = await bucket.get(hash_secret(fresh))
        assert record is not None
        old = ApiKeyRecord.model_validate_json(record).model_copy(update={"key_id": "key_legacy"})
        await bucket.create(hash_secret(legacy), old.model_dump_json().encode())
        for secret in (fresh, legacy):
            user = await keys.authenticate(secret)
            assert user is not None
            assert user.name == "dave"
        assert await keys.authenticate("e2b_" + "0" * 40) is None
        assert await keys.authenticate(legacy.upper()) is None
    finally:
        await nc.close()


def _run_pinned(stack: Stack, key: str) -> subprocess.CompletedProcess[str]:
    try:
        python = pinned_sdk_python(PINNED)
    except RuntimeError as e:
        skip_or_fail(f"cannot install e2b=={PINNED}: {e}")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("E2B_", "PYTHON"))}
    env.update(stack.sdk_env("alice"))
    env["E2B_API_KEY"] = key
    return subprocess.run(
        [str(python), "-c", SCRIPT, PINNED],
        capture_output=True,
        text=True,
        env=env,
        timeout=180,
        check=False,
    )


def test_pinned_sdk_accepts_a_fresh_key_without_disabling_validation(stack: Stack) -> None:
    key = stack.keys["alice"]
    assert E2B_KEY.fullmatch(key)
    done = _run_pinned(stack, key)
    assert done.returncode == 0, done.stderr[-2000:]
    created = re.search(r"created (\S+)", done.stdout)
    assert created is not None, done.stdout
    assert "killed" in done.stdout
    gone = httpx.get(
        f"{stack.api_url}/sandboxes/{created.group(1)}",
        headers={"X-API-KEY": key},
        timeout=30,
    )
    assert gone.status_code == 404


def test_pinned_sdk_refuses_the_old_format_client_side(stack: Stack) -> None:
    """What the new format fixes: 2.45.1 refuses ``torpor_`` keys before sending anything."""
    done = _run_pinned(stack, "torpor_" + "ab" * 24)
    assert done.returncode != 0
    assert "e2b_" in done.stderr
