"""Native sandbox names are per user, on a real stack: a name another user holds (or held) is
free for you, a create never reveals that someone else has it, and your sandbox of that name
shows nothing of theirs — no metadata, no events, no history."""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import httpx
import pytest

from shared.ids import owned_sandbox_id
from tests.support.stack import Stack

pytestmark = pytest.mark.slow
P = "/api/v1/sandbox"


@pytest.fixture
def users(stack: Stack) -> Iterator[dict[str, httpx.Client]]:
    clients = {
        name: httpx.Client(
            base_url=stack.api_url,
            headers={"Authorization": f"Bearer {stack.keys[name]}"},
            timeout=90,
            trust_env=False,
        )
        for name in ("alice", "bob")
    }
    yield clients
    for c in clients.values():
        c.close()


def test_a_held_name_is_free_for_another_user_and_leaks_nothing(
    users: dict[str, httpx.Client],
) -> None:
    alice, bob = users["alice"], users["bob"]
    name = f"shared-{secrets.token_hex(3)}"
    r = bob.post(P, json={"name": name, "metadata": {"owner-note": "bob-private"}})
    assert r.status_code == 201, r.text
    bobs = r.json()
    try:
        # Alice creates the same name while Bob holds it: no 409, no trace of Bob.
        r = alice.post(P, json={"name": name})
        assert r.status_code == 201, r.text
        alices = r.json()
        assert alices["sandboxId"] != bobs["sandboxId"]
        assert alices["sandboxId"] == owned_sandbox_id("alice", name)
        got = alice.get(f"{P}/{name}").json()
        assert got["owner"] == "alice"
        assert got["metadata"] == {}
        assert "bob" not in alice.get(P).text
        # Bob's is untouched, and each one's id is a 404 for the other.
        assert bob.get(f"{P}/{name}").json()["metadata"] == {"owner-note": "bob-private"}
        assert alice.get(f"{P}/{bobs['sandboxId']}").status_code == 404
        assert bob.get(f"{P}/{alices['sandboxId']}").status_code == 404
        # A second create by Alice is a conflict about her own sandbox only.
        r = alice.post(P, json={"name": name})
        assert r.status_code == 409
        assert "bob" not in r.text
        assert alice.delete(f"{P}/{name}").status_code == 204
    finally:
        bob.delete(f"{P}/{name}")


def test_reusing_a_killed_name_shows_none_of_the_old_history(
    users: dict[str, httpx.Client],
) -> None:
    alice, bob = users["alice"], users["bob"]
    name = f"reused-{secrets.token_hex(3)}"
    r = bob.post(P, json={"name": name, "metadata": {"k": "bob"}})
    assert r.status_code == 201, r.text
    assert bob.post(f"{P}/pause/{name}").status_code == 200
    assert bob.delete(f"{P}/{name}").status_code == 204
    bob_events = bob.get(f"{P}/{name}/events").json()["events"]
    assert {"created", "paused", "killed"} <= {e["fact"] for e in bob_events}

    r = alice.post(P, json={"name": name})
    assert r.status_code == 201, r.text
    try:
        mine = r.json()
        assert mine["metadata"] == {}
        assert mine["snapshot"] is None
        events = alice.get(f"{P}/{name}/events").json()["events"]
        assert events, "alice's own sandbox has its created event"
        assert {e["sandboxId"] for e in events} == {mine["sandboxId"]}
        facts = [e["fact"] for e in events]
        assert "killed" not in facts
        assert "paused" not in facts
        # Bob's killed sandbox's history stays his alone.
        assert alice.get(f"{P}/{bob_events[0]['sandboxId']}/events").status_code == 404
    finally:
        alice.delete(f"{P}/{name}")
