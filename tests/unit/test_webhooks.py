"""Webhook rules with fakes: signatures, backoff, the URL and address policy, the fan-out and
one delivery attempt (retry, dead letter, DNS rebinding, history), and no secret in logs."""

from __future__ import annotations

import ipaddress
import json
from datetime import UTC, datetime

import pytest
import structlog

from services.deliverer.delivering import Fanout, Rules, Sender
from shared.bus.retry import Retry
from shared.domain.record import SandboxRecord
from shared.errors import Conflict, InvalidInput, NotFound
from shared.lifecycle.webhooks import Changes, WebhookRegistry
from shared.models.messages import SandboxActivity, SandboxPaused
from shared.models.webhooks import DeliveryJob, Webhook
from shared.redaction import redact_text
from shared.webhooks.addresses import AddressPolicy, RefusedUrl, checked_addresses, parse_url
from shared.webhooks.backoff import Backoff
from shared.webhooks.signing import InvalidSignature, new_secret, sign, verify
from tests.fakes.publisher import RecordingPublisher
from tests.fakes.store import InMemorySandboxStore
from tests.fakes.webhooks import (
    FakeResolver,
    InMemoryDeliveryLog,
    InMemoryWebhooks,
    RecordingTransport,
    TransportDown,
)

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LOOPBACK = AddressPolicy(allow=(ipaddress.ip_network("127.0.0.0/8"),))

# ------------------------------------------------------------------ signatures


def test_signature_round_trip_and_tampering() -> None:
    secret, body = new_secret(), b'{"id":"paused:s:g2"}'
    header = sign(secret, body, 1_000_000)
    assert header.startswith("t=1000000,v1=")
    assert verify(secret, header, body, now=1_000_100) == 1_000_000
    for bad_secret, bad_body, now in (
        ("whsec_other", body, 1_000_100),  # another secret
        (secret, body + b" ", 1_000_100),  # changed body
        (secret, body, 1_000_301),  # stale: older than the 300 s tolerance
        (secret, body, 999_699),  # from the future
    ):
        with pytest.raises(InvalidSignature):
            verify(bad_secret, header, bad_body, now=now)
    # a replay with a fresh timestamp but the old digest
    _, digest = header.split(",v1=")
    with pytest.raises(InvalidSignature):
        verify(secret, f"t=1000200,v1={digest}", body, now=1_000_200)
    for malformed in ("", "v1=abc", "t=abc,v1=x", "t=1000000", "t=1" + "0" * 20 + ",v1=x"):
        with pytest.raises(InvalidSignature):
            verify(secret, malformed, body, now=1_000_000)


def test_secrets_are_masked_wherever_they_are_printed() -> None:
    secret = new_secret()
    assert secret not in redact_text(f"delivering with {secret} now")


# ------------------------------------------------------------------ backoff


def test_backoff_doubles_up_to_the_cap_with_bounded_jitter() -> None:
    b = Backoff(base=2, cap=30, jitter=0.2)
    assert b.schedule(7) == [2, 4, 8, 16, 30, 30]
    assert [b.delay(n, rand=lambda lo, hi: 1.0) for n in (1, 2, 3, 10)] == [2, 4, 8, 30]
    assert b.delay(3, rand=lambda lo, hi: lo) == pytest.approx(6.4)
    assert b.delay(3, rand=lambda lo, hi: hi) == pytest.approx(9.6)


# ------------------------------------------------------------------ URLs and addresses


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "gopher://127.0.0.1:70/_x",
        "ftp://example.com/",
        "http://user:pw@example.com/",
        "http://example.com/\x00",
        "http://exa mple.com/",
        "http://example.com/#frag",
        "http://" + "a" * 2100 + ".com/",
        "http:///nohost",
        "http://example.com:99999/",
        "--ro-bind",
        "http://éxample.com/",
    ],
)
def test_hostile_urls_are_refused(url: str) -> None:
    with pytest.raises(RefusedUrl, match=r"^url: "):
        parse_url(url)


def test_url_parts() -> None:
    t = parse_url("HTTPS://Example.COM/hook?a=1")
    assert (t.scheme, t.host, t.port, t.path, t.host_header) == (
        "https",
        "example.com",
        443,
        "/hook?a=1",
        "example.com",
    )
    assert parse_url("http://[::1]:8000").host_header == "[::1]:8000"


@pytest.mark.parametrize(
    ("address", "port", "refused"),
    [
        ("93.184.216.34", 443, False),  # public
        ("127.0.0.1", 9000, True),  # loopback: not opened by default
        ("10.1.2.3", 9000, True),  # private
        ("169.254.169.254", 80, True),  # cloud metadata
        ("100.64.0.1", 80, True),  # carrier-grade NAT
        ("0.0.0.0", 80, True),
        ("::1", 80, True),
        ("::ffff:127.0.0.1", 80, True),  # IPv4-mapped loopback
        ("fd00::1", 80, True),  # unique local
        ("224.0.0.1", 80, True),  # multicast
    ],
)
def test_default_policy_allows_only_public_addresses(
    address: str, port: int, refused: bool
) -> None:
    assert (AddressPolicy().refusal(address, port) is not None) is refused


def test_control_plane_ports_stay_refused_where_loopback_is_opened() -> None:
    policy = AddressPolicy(allow=LOOPBACK.allow, control_ports=frozenset({3000, 4222, 49983}))
    assert policy.refusal("127.0.0.1", 9000) is None
    for port in (3000, 4222, 49983):
        assert "control plane" in (policy.refusal("127.0.0.1", port) or "")
        assert policy.refusal("::ffff:127.0.0.1", port) is not None
    deny = AddressPolicy(deny=(ipaddress.ip_network("93.184.216.0/24"),))
    assert deny.refusal("93.184.216.34", 443) is not None


async def test_a_name_with_one_refused_address_is_refused() -> None:
    resolver = FakeResolver({"mixed.test": [["93.184.216.34", "10.0.0.1"]]})
    with pytest.raises(RefusedUrl, match=r"10\.0\.0\.1"):
        await checked_addresses(parse_url("http://mixed.test/"), AddressPolicy(), resolver)


# ------------------------------------------------------------------ registry


def registry(resolver: FakeResolver | None = None) -> WebhookRegistry:
    return WebhookRegistry(
        InMemoryWebhooks(),
        InMemoryDeliveryLog(),
        policy=LOOPBACK,
        resolver=resolver or FakeResolver(),
        clock=lambda: NOW,
    )


async def test_registry_validates_and_scopes_by_owner() -> None:
    reg = registry()
    hook = await reg.create(
        "alice", url="http://127.0.0.1:9000/h", events=["sandbox.lifecycle.paused"]
    )
    assert hook.secret.startswith("whsec_") and len(hook.secret) > 40
    with pytest.raises(NotFound):
        await reg.get("bob", hook.id)
    with pytest.raises(NotFound):
        await reg.delete("bob", hook.id)
    assert await reg.owned("bob") == []
    for bad in ({"events": []}, {"events": ["sandbox.lifecycle.nope"]}, {"name": "a\x00b"}):
        with pytest.raises(InvalidInput):
            await reg.create(
                "alice",
                url="http://127.0.0.1:9000/h",
                **{"events": ["sandbox.lifecycle.paused"], **bad},  # type: ignore[arg-type]
            )
    with pytest.raises(InvalidInput, match="signatureSecret"):
        await reg.create(
            "alice", url="http://127.0.0.1:9000/", events=["sandbox.lifecycle.paused"], secret="x"
        )
    with pytest.raises(RefusedUrl):
        await reg.update("alice", hook.id, Changes(url="http://10.0.0.1/"))
    for _ in range(19):
        await reg.create("alice", url="http://127.0.0.1:9000/", events=["sandbox.lifecycle.paused"])
    with pytest.raises(Conflict):
        await reg.create("alice", url="http://127.0.0.1:9000/", events=["sandbox.lifecycle.paused"])


# ------------------------------------------------------------------ fan-out and delivery


def hook(**over: object) -> Webhook:
    base: dict[str, object] = {
        "id": "wh-aaaaaaaaaaaaaaaaaaaa",
        "owner": "alice",
        "name": "n",
        "url": "http://127.0.0.1:9000/hook",
        "events": ("sandbox.lifecycle.paused",),
        "secret": new_secret(),
        "created_at": NOW,
        "updated_at": NOW,
    }
    return Webhook.model_validate({**base, **over})


async def world() -> tuple[InMemorySandboxStore, InMemoryWebhooks, InMemoryDeliveryLog]:
    records = InMemorySandboxStore()
    await records.create(
        SandboxRecord(
            sandbox_id="sbx1", owner="alice", created_at=NOW, started_at=NOW, updated_at=NOW
        )
    )
    return records, InMemoryWebhooks(), InMemoryDeliveryLog()


async def test_fanout_one_job_per_wanting_webhook_and_idempotent() -> None:
    records, hooks, history = await world()
    await hooks.create(hook())
    await hooks.create(hook(id="wh-bbbbbbbbbbbbbbbbbbbb", enabled=False))
    await hooks.create(hook(id="wh-cccccccccccccccccccc", events=("sandbox.lifecycle.killed",)))
    await hooks.create(hook(id="wh-dddddddddddddddddddd", owner="bob"))
    publisher = RecordingPublisher()
    fanout = Fanout(records=records, hooks=hooks, history=history, publisher=publisher)
    paused = SandboxPaused(sandbox_id="sbx1", generation=2, at=NOW).model_dump_json().encode()
    for _ in range(2):  # a redelivered event: the same job id
        assert (
            await fanout.on_event("sandbox.evt.paused.sbx1", paused, msg_id="paused:sbx1:g2", seq=5)
            == 1
        )
    assert [p.msg_id for p in publisher.published] == ["wh-aaaaaaaaaaaaaaaaaaaa:paused:sbx1:g2"]
    assert len(publisher.duplicates) == 1  # the second fan-out is the same job: dropped
    activity = SandboxActivity(sandbox_id="sbx1", generation=2, at=NOW).model_dump_json().encode()
    assert await fanout.on_event("sandbox.evt.activity.sbx1", activity, msg_id="a", seq=6) == 0


def sender(
    hooks: InMemoryWebhooks,
    history: InMemoryDeliveryLog,
    transport: RecordingTransport,
    publisher: RecordingPublisher,
    *,
    resolver: FakeResolver | None = None,
    max_attempts: int = 3,
) -> Sender:
    return Sender(
        hooks=hooks,
        history=history,
        transport=transport,
        failure=TransportDown,
        publisher=publisher,
        rules=Rules(policy=LOOPBACK, backoff=Backoff(base=1, cap=8), max_attempts=max_attempts),
        resolver=resolver or FakeResolver(),
        clock=lambda: NOW,
        now=lambda: 1_000_000.0,
    )


def job(h: Webhook) -> DeliveryJob:
    return DeliveryJob(
        webhook_id=h.id,
        owner=h.owner,
        event_id="paused:sbx1:g2",
        event_type="sandbox.lifecycle.paused",
        sandbox_id="sbx1",
        body='{"id":"paused:sbx1:g2"}',
    )


async def test_delivery_signed_retried_then_delivered() -> None:
    _, hooks, history = await world()
    h = hook()
    await hooks.create(h)
    transport = RecordingTransport(answers=[None, 503])
    send = sender(hooks, history, transport, RecordingPublisher())
    for attempt in (1, 2):
        with pytest.raises(Retry) as retry:
            await send.on_job(job(h), attempt)
        assert 0.8 * 2 ** (attempt - 1) <= retry.value.delay <= 1.2 * 2 ** (attempt - 1)
    record = await history.get(h.id, "paused:sbx1:g2")
    assert record is not None and record.state == "retrying" and record.last_status == 503
    assert await send.on_job(job(h), 3) == "delivered"
    target, address, body, headers = transport.sent[-1]
    assert (address, target.port, target.path) == ("127.0.0.1", 9000, "/hook")
    assert headers["Torpor-Event-Id"] == "paused:sbx1:g2"
    assert headers["Torpor-Delivery-Attempt"] == "3"
    assert verify(h.secret, headers["Torpor-Signature"], body, now=1_000_000) == 1_000_000
    record = await history.get(h.id, "paused:sbx1:g2")
    assert record is not None and (record.state, record.attempts) == ("delivered", 3)


async def test_dead_letter_after_the_limit_with_the_reason_and_no_secret_logged() -> None:
    _, hooks, history = await world()
    h = hook()
    await hooks.create(h)
    publisher = RecordingPublisher()
    send = sender(hooks, history, RecordingTransport(answers=[500, 500, 500]), publisher)
    with structlog.testing.capture_logs() as logs:
        for attempt in (1, 2):
            with pytest.raises(Retry):
                await send.on_job(job(h), attempt)
        assert await send.on_job(job(h), 3) == "dead_lettered"
    [published] = publisher.published
    letter = published.message
    assert published.subject == "sandbox.dlq.deliverer-send.sbx1"
    assert letter.reason == "HTTP 500" and letter.attempts == 3  # type: ignore[attr-defined]
    record = await history.get(h.id, "paused:sbx1:g2")
    assert record is not None and record.last_error == "HTTP 500"
    assert h.secret not in json.dumps(logs, default=str)
    assert h.secret not in letter.model_dump_json()


async def test_dns_rebinding_is_refused_at_delivery() -> None:
    _, hooks, history = await world()
    h = hook(url="http://rebind.test:9000/")
    await hooks.create(h)
    resolver = FakeResolver({"rebind.test": [["127.0.0.1"], ["10.9.9.9"]]})
    reg = WebhookRegistry(hooks, history, policy=LOOPBACK, resolver=resolver)
    await reg.update("alice", h.id, Changes(url="http://rebind.test:9000/"))  # 127.0.0.1: fine
    transport = RecordingTransport()
    publisher = RecordingPublisher()
    send = sender(hooks, history, transport, publisher, resolver=resolver)
    assert await send.on_job(job(h), 1) == "dead_lettered"  # now 10.9.9.9: refused
    assert transport.sent == []
    assert "10.9.9.9" in publisher.published[0].message.reason  # type: ignore[attr-defined]


async def test_deleted_or_disabled_webhook_drops_the_job() -> None:
    _, hooks, history = await world()
    h = hook()
    transport = RecordingTransport()
    send = sender(hooks, history, transport, RecordingPublisher())
    assert await send.on_job(job(h), 1) == "dropped"
    await hooks.create(h.model_copy(update={"enabled": False}))
    assert await send.on_job(job(h), 1) == "dropped"
    assert transport.sent == []
