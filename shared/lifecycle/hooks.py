"""Running a sandbox's lifecycle hooks through its daemon (the snapshotter and the scaler call it).

Order: the template's hook of that kind, then the sandbox's own. Each runs to its end or its
timeout as ``user`` (``/bin/bash -l -c``); the first failure whose policy is ``abort`` stops
there (what follows does not run). A hook that could not run at all (the daemon unreachable) has
failed like any other. Every outcome is published as ``sandbox.evt.hook`` (id
``hook:<sid>:g<gen>:<hook>:<source>``: a redelivered command re-runs its hooks — they must be
idempotent — and its event is deduplicated). Outcomes carry the tail of the output, never the
command, with the sandbox's env values and secret-shaped strings masked.

An abort refuses a pause the sandbox's owner asked for, always. A pause by timeout (or by the
platform) is the operator's bound, not the tenant's: its abort is honoured only while the sandbox
is within the template's ``maxLifetime`` since it last started; past it the pause proceeds and the
outcome says ``overridden`` (``abort_honoured``). We bound by ``maxLifetime`` rather than by a
number of refusals: it is the bound the operator already set on activity inside the sandbox, it
needs no counter on the record that a redelivery or a resume would have to keep right, and its
cost is predictable (a count of refusals times a timeout the tenant chooses is not).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Literal

import structlog

from shared.domain.record import SandboxRecord
from shared.domain.transitions import now
from shared.errors import EnvdError, EnvdUnavailable
from shared.models.lifecycle import Hook, HookName, HookOutcome, Hooks, HookSource
from shared.models.messages import SandboxHookRan
from shared.ports.bus import Publisher, emit
from shared.ports.envd import CommandResult, Envd
from shared.ports.workloads import Endpoint
from shared.redaction import MASK

log = structlog.get_logger()

HOOK_USER = "user"  # E2B's default user: hooks never run as root
_MIN_MASKED = 4  # env values shorter than this are not masked (they would mask everything)
Op = Literal["pause", "resume", "kill"]
PauseReason = Literal["user", "timeout", "platform"]


def abort_honoured(
    reason: PauseReason, *, started_at: datetime, max_lifetime: int, at: datetime
) -> bool:
    """May a prePause abort refuse this pause? A user's: always. A timeout's or the platform's:
    only while the sandbox is within ``max_lifetime`` seconds of its last start."""
    if reason == "user":
        return True
    return at < started_at + timedelta(seconds=max_lifetime)


def declared(name: HookName, template: Hooks, sandbox: Hooks) -> list[tuple[HookSource, Hook]]:
    """The hooks of kind ``name`` to run, in order: the template's, then the sandbox's."""
    out: list[tuple[HookSource, Hook]] = []
    for source, hooks in (("template", template), ("sandbox", sandbox)):
        hook = hooks.of(name)
        if hook is not None:
            out.append((source, hook))  # type: ignore[arg-type]
    return out


def mask_values(text: str, values: list[str]) -> str:
    for value in sorted((v for v in values if len(v) >= _MIN_MASKED), key=len, reverse=True):
        text = text.replace(value, MASK)
    return text


def outcome_of(
    name: HookName,
    source: HookSource,
    hook: Hook,
    result: CommandResult | None,
    *,
    duration_ms: float,
    error: str | None = None,
    secrets: list[str] | None = None,
    may_abort: bool = True,
) -> HookOutcome:
    """``result`` None: it did not run (``error`` says why). ``may_abort`` False: a failure
    with policy abort is recorded as ``overridden`` and does not stop the transition."""
    ok = result is not None and result.exit_code == 0 and not result.timed_out
    if result is not None and result.timed_out:
        error = f"timed out after {hook.timeout}s (killed)"
    output = mask_values(result.output, secrets or []) if result is not None else ""
    return HookOutcome(
        hook=name,
        source=source,
        policy=hook.on_failure,
        ok=ok,
        exit_code=result.exit_code if result is not None else None,
        duration_ms=round(duration_ms, 1),
        output=output,
        error=mask_values(error, secrets or []) if error else None,
        aborted=not ok and hook.on_failure == "abort" and may_abort,
        overridden=not ok and hook.on_failure == "abort" and not may_abort,
    )


def refusal(outcomes: list[HookOutcome]) -> HookOutcome | None:
    """The outcome that stopped the transition, if one did."""
    return next((o for o in outcomes if o.aborted), None)


def describe(outcome: HookOutcome) -> str:
    how = (
        outcome.error
        if outcome.error
        else f"exit code {outcome.exit_code}"
        if outcome.exit_code is not None
        else "failed"
    )
    return f"the {outcome.source}'s {outcome.hook} hook failed ({how}; onFailure: abort)"


class HookRunner:
    def __init__(self, *, envd: Envd, publisher: Publisher) -> None:
        self._envd = envd
        self._publisher = publisher

    async def run(
        self,
        name: HookName,
        op: Op,
        record: SandboxRecord,
        endpoint: Endpoint,
        template: Hooks,
        *,
        may_abort: bool = True,
    ) -> list[HookOutcome]:
        outcomes: list[HookOutcome] = []
        secrets = list(record.envs.values())
        if record.envd_access_token:
            secrets.append(record.envd_access_token)
        for source, hook in declared(name, template, record.hooks):
            started = time.monotonic()
            result: CommandResult | None = None
            error: str | None = None
            try:
                result = await self._envd.run_command(
                    endpoint,
                    hook.command,
                    user=HOOK_USER,
                    timeout=float(hook.timeout),
                    access_token=record.envd_access_token,
                )
            except (EnvdUnavailable, EnvdError) as e:
                error = f"did not run: {e}"
            outcome = outcome_of(
                name,
                source,
                hook,
                result,
                duration_ms=(time.monotonic() - started) * 1000,
                error=error,
                secrets=secrets,
                may_abort=may_abort,
            )
            outcomes.append(outcome)
            log.info(
                "hook_ran",
                hook=name,
                source=source,
                ok=outcome.ok,
                exit_code=outcome.exit_code,
                duration_ms=outcome.duration_ms,
                aborted=outcome.aborted,
                overridden=outcome.overridden,
            )
            await emit(
                self._publisher,
                SandboxHookRan(
                    sandbox_id=record.sandbox_id,
                    generation=record.generation,
                    at=now(),
                    op=op,
                    outcome=outcome,
                ),
                name,
                source,
            )
            if outcome.aborted:
                break
        return outcomes
