"""The sandbox states and the named questions every service asks about them.

A service never lists states itself: it asks a predicate here (``is_gone``, ``is_resumable``, …),
so adding or changing a state is one edit in this file (plus the table in ``transitions``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class SandboxState(StrEnum):
    CREATING = "creating"  # record written, first pod not ready yet (E2B: running)
    RUNNING = "running"
    PAUSING = "pausing"
    PAUSED = "paused"
    RESUMING = "resuming"
    KILLING = "killing"
    KILLED = "killed"
    FAILED = "failed"

    @property
    def e2b(self) -> Literal["running", "paused"]:
        """E2B only knows running and paused (its OpenAPI ``SandboxState``; the SDK's enum
        raises on any other value): map transitional states to the nearer one. ``failed`` is
        not running; like paused it is still the user's, listed and killable, and a connect
        resumes it (``RESUMABLE``), which is what E2B's "paused" promises."""
        if self in (SandboxState.PAUSED, SandboxState.PAUSING, SandboxState.FAILED):
            return "paused"
        return "running"


S = SandboxState

# Gone or going: hidden from users (404), nothing more is done for it but the kill.
GONE = frozenset({S.KILLING, S.KILLED})
# A transition is in flight (one command owns the record, see ``transitions.owns``).
TRANSITIONAL = frozenset({S.CREATING, S.PAUSING, S.RESUMING, S.KILLING})
# Where a transition ends: a waiter on the record stops at one of these (or at GONE).
STEADY = frozenset({S.RUNNING, S.PAUSED, S.FAILED})
# A resume from here starts a new pod (the proxy's auto-resume, the resume quota and rate).
RESUMABLE = frozenset({S.PAUSED, S.PAUSING, S.FAILED})
# On its way to running: a request waits for it instead of resuming.
STARTING = frozenset({S.CREATING, S.RESUMING})
# Holds (or is about to hold) a pod: what the running-sandboxes quota counts.
HOLDS_POD = frozenset({S.CREATING, S.RUNNING, S.RESUMING, S.PAUSING})
# Running as far as a resume is concerned: resume answers 409, connect extends the timeout.
UP = frozenset({S.RUNNING, S.CREATING})


def is_gone(state: SandboxState) -> bool:
    return state in GONE


def is_visible(state: SandboxState) -> bool:
    """Shown to users (listed, readable); killing ones are shown to no view either."""
    return state not in GONE


def exists(state: SandboxState) -> bool:
    """Not a tombstone: a killed record is kept for a while but does not exist for users."""
    return state != S.KILLED


def is_transitional(state: SandboxState) -> bool:
    return state in TRANSITIONAL


def is_settled(state: SandboxState) -> bool:
    """A transition ended here (steady) or the sandbox is gone."""
    return state in STEADY or state in GONE


def is_resumable(state: SandboxState) -> bool:
    """A resume from this state starts a new pod."""
    return state in RESUMABLE


def is_starting(state: SandboxState) -> bool:
    return state in STARTING


def counts_as_running(state: SandboxState) -> bool:
    """Counted against the running-sandboxes quota."""
    return state in HOLDS_POD


def is_up(state: SandboxState) -> bool:
    """Running or about to be: a resume is refused (409), a connect extends the timeout."""
    return state in UP


def is_running(state: SandboxState) -> bool:
    """Serving on a pod: the only state with a deadline, activity and a daemon to talk to."""
    return state == S.RUNNING
