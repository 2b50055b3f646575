"""Lifecycle hooks and what a template says about a sandbox's lifecycle (pure).

Hooks: commands a template or a sandbox declares for three moments — ``prePause`` (before the
processes are captured), ``postResume`` (after the replay), ``preKill`` (before the workload is
deleted) — run inside the sandbox through its daemon as ``user``, each with a timeout and a
failure policy: ``abort`` stops the transition (a pause is refused and the sandbox keeps
running; a resume ends ``failed``), ``ignore`` records the failure and carries on. A kill is never
refused, so ``preKill`` takes ``ignore`` only. See docs/lifecycle-hooks.md.

``TemplateFacts`` is read from the template (``shared.runtime.template_facts``) by the services
that need it: the scaler (is the sandbox's disk kept, which version of the template runs, its
hooks) and the snapshotter (its hooks).
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from shared.redaction import redact_text

HookName = Literal["prePause", "postResume", "preKill"]
FailurePolicy = Literal["abort", "ignore"]
HookSource = Literal["template", "sandbox"]

MAX_HOOK_COMMAND = 4096
MAX_HOOK_TIMEOUT = 300  # seconds: a transition waits for its hooks, and its command's ack wait
MAX_HOOK_OUTPUT = 2048  # characters of output kept in the outcome (the tail)
# Control characters but tab and newline: a command is a shell script, never a terminal sequence.
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


class Hook(_Frozen):
    """One command: run as ``/bin/bash -l -c <command>`` by user ``user`` in their home."""

    command: str = Field(min_length=1, max_length=MAX_HOOK_COMMAND)
    timeout: int = Field(default=30, ge=1, le=MAX_HOOK_TIMEOUT, description="seconds")
    on_failure: FailurePolicy = Field(default="ignore", alias="onFailure")

    @field_validator("command")
    @classmethod
    def _printable(cls, value: str) -> str:
        if _CONTROL.search(value):
            msg = "a hook command must not contain NUL or control characters (tab, newline: ok)"
            raise ValueError(msg)
        if not value.strip():
            msg = "a hook command must not be blank"
            raise ValueError(msg)
        return value


class Hooks(_Frozen):
    pre_pause: Hook | None = Field(default=None, alias="prePause")
    post_resume: Hook | None = Field(default=None, alias="postResume")
    pre_kill: Hook | None = Field(default=None, alias="preKill")

    @model_validator(mode="after")
    def _kill_is_never_refused(self) -> Hooks:
        if self.pre_kill is not None and self.pre_kill.on_failure == "abort":
            msg = "preKill: a kill is never refused, so onFailure must be ignore"
            raise ValueError(msg)
        return self

    def of(self, name: HookName) -> Hook | None:
        return {
            "prePause": self.pre_pause,
            "postResume": self.post_resume,
            "preKill": self.pre_kill,
        }[name]

    def __bool__(self) -> bool:
        return any(h is not None for h in (self.pre_pause, self.post_resume, self.pre_kill))


NO_HOOKS = Hooks()


class HookOutcome(BaseModel):
    """How one hook ran: for the events, the record and the API's error body. The output is the
    tail of stdout and stderr together, redacted; the command itself is not repeated (it may
    carry a secret the author put there)."""

    model_config = ConfigDict(frozen=True)

    hook: HookName
    source: HookSource
    policy: FailurePolicy
    ok: bool
    exit_code: int | None = None  # None: it did not end by itself (timeout, daemon unreachable)
    duration_ms: float = 0.0
    output: str = ""
    error: str | None = None  # why it did not run or end (timed out, daemon unreachable)
    aborted: bool = False  # this failure stopped the transition
    # An abort not honoured: a timeout pause past the template's maxLifetime proceeds anyway
    # (shared.lifecycle.hooks.abort_honoured), so a hook cannot keep a sandbox up for ever.
    overridden: bool = False

    @field_validator("output", "error")
    @classmethod
    def _no_secrets(cls, value: str | None) -> str | None:
        if value is None:
            return None
        return redact_text(value)[-MAX_HOOK_OUTPUT:]


Signal = Literal["cpu", "output", "connections", "keepalive"]
MAX_LIFETIME_CAP = 30 * 86400


class ActivityPolicy(_Frozen):
    """What counts as activity *inside* the sandbox for its inactivity timeout (traffic through
    the proxy and API calls always count), and the warning before an automatic pause or kill.

    A sandbox whose processes keep it busy could stay up for ever: inside activity never moves
    the deadline past ``maxLifetime`` seconds after the sandbox last started (create or resume).
    Traffic from outside is not bounded by it."""

    signals: tuple[Signal, ...] = Field(default=(), max_length=4)
    max_lifetime: int = Field(default=3600, ge=10, le=MAX_LIFETIME_CAP, alias="maxLifetime")
    expiring_notice: int = Field(default=0, ge=0, le=3600, alias="expiringNotice")

    @field_validator("signals")
    @classmethod
    def _unique(cls, value: tuple[Signal, ...]) -> tuple[Signal, ...]:
        return tuple(dict.fromkeys(value))


DEFAULT_ACTIVITY = ActivityPolicy()


class TemplateLifecycle(_Frozen):
    """A template's ``lifecycle:`` section (local runtime: YAML; Kubernetes: the PodTemplate's
    ``torpor.dev/lifecycle`` annotation, JSON of the same shape)."""

    hooks: Hooks = NO_HOOKS
    activity: ActivityPolicy = DEFAULT_ACTIVITY


class TemplateFacts(BaseModel):
    model_config = ConfigDict(frozen=True)

    name: str
    version: str | None = None  # a content digest of the template; None: unknown
    keeps_files: bool = True  # persist: layer (the sandbox's disk outlives a pause)
    hooks: Hooks = NO_HOOKS
    activity: ActivityPolicy = DEFAULT_ACTIVITY


def unknown_template(name: str) -> TemplateFacts:
    """For wiring without templates (unit tests): nothing known, the default persist mode."""
    return TemplateFacts(name=name)
