"""A test-only durable with a short ack wait, so an unacknowledged message comes back quickly.

On SANDBOX_EVT (limits retention) because work-queue streams reject overlapping consumers."""

from shared.bus.retry import RetryPolicy
from shared.bus.topology import STREAM_EVT, Durable

TEST_DURABLE = Durable(
    STREAM_EVT,
    "foundation-test-worker",
    ("sandbox.evt.activity.*",),
    retry=RetryPolicy(ack_wait=2, give_up_after=2, dead_letter_after=5, max_deliver=5),
)
