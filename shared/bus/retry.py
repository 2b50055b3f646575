"""The one retry policy: how often, and how fast, a message that fails is handled again.

Per delivery ``n`` of a message (JetStream's ``num_delivered``, from 1):

- a **permanent** error (``PERMANENT``: the message itself can never be handled: it does not
  parse, or its subject and body disagree) is dead-lettered at once;
- a lifecycle worker **gives up** at ``n >= give_up_after``: the transition is failed on the
  record and the message acked (``shared.lifecycle.worker.guarded``), so no sandbox is left
  half-way; a dead-lettered command would leave it stuck mid-transition;
- any other error is NAKed with a delay of ``min(max_delay, 2**n)`` ±20 % (consumer ``backoff``
  does not apply to NAKs), until ``n >= dead_letter_after``: then it is dead-lettered;
- a handler that crashes or hangs without acking gets its message back after ``ack_wait``
  (long handlers send heartbeats within it), at most ``max_deliver`` times in all.

Each durable carries its policy (``shared.bus.topology.Durable.retry``); the middleware, the
consumer config and the workers all read it from there.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from typing import Literal

from pydantic import ValidationError


class PoisonMessage(Exception):
    """The message can never be handled: dead-letter it at once."""


class Retry(Exception):
    """Handle again later (e.g. the sandbox is mid-transition). ``delay`` in seconds."""

    def __init__(self, reason: str, *, delay: float = 2.0) -> None:
        super().__init__(reason)
        self.delay = delay


# What the message did wrong, as opposed to what went wrong while handling it. A ValueError from
# handler code is not here: it is retried like any other failure.
PERMANENT: tuple[type[Exception], ...] = (
    PoisonMessage,
    ValidationError,
    json.JSONDecodeError,
    UnicodeDecodeError,
)

Action = Literal["retry", "dead_letter"]


@dataclass(frozen=True)
class RetryPolicy:
    ack_wait: float = 30.0
    give_up_after: int = 5
    dead_letter_after: int = 8
    max_deliver: int = 12
    max_delay: float = 60.0
    heartbeat: float | None = None  # None: a third of ack_wait

    def __post_init__(self) -> None:
        # give_up_after >= dead_letter_after is allowed: the worker then never gives up (a failing
        # command is dead-lettered first and its sandbox stays mid-transition; crash tests use it).
        if not (self.give_up_after >= 1 and 1 <= self.dead_letter_after <= self.max_deliver):
            msg = (
                "retry limits must satisfy give_up_after >= 1 and"
                " 1 <= dead_letter_after <= max_deliver"
                f" (got {self.give_up_after}, {self.dead_letter_after}, {self.max_deliver})"
            )
            raise ValueError(msg)
        if self.ack_wait <= 0 or self.max_delay <= 0:
            msg = "ack_wait and max_delay must be positive"
            raise ValueError(msg)
        if self.heartbeat is not None and not 0 < self.heartbeat < self.ack_wait:
            msg = f"the heartbeat must come within ack_wait ({self.ack_wait} s)"
            raise ValueError(msg)

    def tuned(self, *, give_up_after: int, heartbeat: float) -> RetryPolicy:
        """The same policy with a worker's settings for giving up and heartbeats."""
        return replace(self, give_up_after=give_up_after, heartbeat=heartbeat)

    @property
    def heartbeat_every(self) -> float:
        """How often a long handler tells JetStream it is still working: within ack_wait."""
        return self.heartbeat if self.heartbeat is not None else self.ack_wait / 3

    def gives_up(self, delivery: int) -> bool:
        return delivery >= self.give_up_after

    def on_error(self, error: BaseException, delivery: int) -> tuple[Action, float]:
        """What the middleware does with a failed delivery: retry after a delay, or dead-letter."""
        if isinstance(error, PERMANENT) or delivery >= self.dead_letter_after:
            return "dead_letter", 0.0
        return "retry", min(self.max_delay, 2.0**delivery) * random.uniform(0.8, 1.2)


DEFAULT = RetryPolicy()
