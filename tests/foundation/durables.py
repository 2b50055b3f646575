"""A test-only durable with a short ack wait, so an unacknowledged message comes back quickly.

On SANDBOX_EVT (limits retention) because work-queue streams reject overlapping consumers."""

from shared.bus.topology import STREAM_EVT, Durable

TEST_DURABLE = Durable(
    STREAM_EVT, "foundation-test-worker", ("sandbox.evt.activity.*",), backoff=(2, 2), max_deliver=5
)
