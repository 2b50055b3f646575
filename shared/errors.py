"""torpor's own exception tree. Adapters translate library errors into these at the boundary.

TorporError
├── ConfigError                  bad configuration (one readable line, no traceback)
├── InvalidInput                 a request value is refused (the message names the field)
├── NotFound                     the thing does not exist (or is not yours)
├── Conflict                     optimistic-concurrency loss or an illegal state transition
│   ├── IllegalTransition
│   └── PauseRefused             a prePause hook with onFailure abort failed: still running
├── Unavailable                  a dependency cannot be reached right now (retry later)
│   └── EnvdUnavailable
├── EnvdError                    the in-sandbox daemon answered with an error
├── RuntimeFailure               the runtime could not do what was asked
│   ├── PodNotReady              a pod did not become ready in time
│   └── ReadyFailed              a template's ready command never succeeded
└── SnapshotTooLarge             a snapshot would not fit the annotation size limit
"""

from __future__ import annotations


class TorporError(Exception):
    """Base of every error torpor raises on purpose."""


class ConfigError(TorporError):
    """Configuration is invalid; the message is one line meant for an operator."""


class InvalidInput(TorporError):
    """A user value is refused; the message starts with the field it names (HTTP 400)."""


class NotFound(TorporError):
    """The object does not exist (or belongs to someone else)."""


class Conflict(TorporError):
    """A compare-and-set lost a race, or the object changed underneath."""


class IllegalTransition(Conflict):
    """The sandbox is in a state from which the requested transition is not allowed."""

    def __init__(self, message: str, *, state: str | None = None) -> None:
        super().__init__(message)
        self.state = state


class PauseRefused(Conflict):
    """A ``prePause`` hook (``onFailure: abort``) failed, so the sandbox kept running (HTTP 409).
    ``hook``: its outcome as JSON-ready data (exit code, duration, redacted output tail)."""

    def __init__(self, message: str, *, hook: dict[str, object]) -> None:
        super().__init__(message)
        self.hook = hook


class QuotaExceeded(TorporError):
    """A per-user quota or rate limit refuses the request (HTTP 429). ``retry_after``: seconds
    until it may succeed; ``retryable`` is false for a count quota, which only the user's own
    kills and pauses free."""

    def __init__(self, message: str, *, retry_after: int, retryable: bool) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.retryable = retryable


class Unavailable(TorporError):
    """A dependency is unreachable; the operation may succeed later."""


class EnvdUnavailable(Unavailable):
    """The in-sandbox daemon could not be reached."""


class EnvdError(TorporError):
    """The in-sandbox daemon answered with a Connect/HTTP error."""

    def __init__(self, message: str, *, code: str = "unknown") -> None:
        super().__init__(message)
        self.code = code


class RuntimeFailure(TorporError):
    """The runtime (local or Kubernetes) failed to carry out an operation."""


class PodNotReady(RuntimeFailure):
    """The workload's pod did not become ready before the deadline."""


class ReadyFailed(RuntimeFailure):
    """The pod's daemon is up but its template's ready command never succeeded before the
    deadline: no retry heals that (the message carries the last attempt's exit code/output)."""


class SnapshotTooLarge(TorporError):
    """The encoded snapshot exceeds the annotation budget."""


class Unsupported(TorporError):
    """This runtime cannot do what was asked (yet); refused openly, never done halfway (501)."""
