"""``QuotaGuard``: the checks the api and the proxy make before a create or a resume.

Counts come from the sandbox records (the bus is the only state, so every replica sees the same
numbers). A create is checked after its record is inserted: each creator counts the records
inserted before its own, so concurrent creates (on any replica) never exceed the limit together;
at worst some are refused that a strict queue would have admitted. A resume is checked when it
is admitted: resumes admitted at the same moment may exceed ``max_running`` by their number,
which the resume burst bounds."""

from __future__ import annotations

from shared.domain import states
from shared.domain.record import SandboxRecord
from shared.errors import QuotaExceeded
from shared.models.quota import Quota
from shared.quota.models import QuotaSettings, effective
from shared.quota.ports import RecordSource, UserSource
from shared.quota.rates import RateLimiter

COUNT_RETRY_AFTER = 30  # a hint only: a held-sandboxes quota frees up when the user acts


class QuotaGuard:
    def __init__(
        self,
        defaults: QuotaSettings,
        *,
        users: UserSource,
        records: RecordSource,
        rates: RateLimiter,
    ) -> None:
        self.defaults = defaults
        self._users = users
        self._records = records
        self._rates = rates

    async def quota_of(self, user: str) -> Quota:
        found = await self._users.get(user)
        return effective(self.defaults, found.quota if found is not None else None)

    async def _held(self, user: str) -> list[SandboxRecord]:
        return [
            r for r in await self._records.list() if r.owner == user and not states.is_gone(r.state)
        ]

    async def before_create(self, user: str) -> None:
        quota = await self.quota_of(user)
        await self._rates.take(
            "create", user, per_minute=quota.creates_per_minute, burst=quota.create_burst
        )

    async def admit_created(self, record: SandboxRecord) -> None:
        """Called with the new record already inserted (and so counted)."""
        quota = await self.quota_of(record.owner)
        held = await self._held(record.owner)
        if quota.max_sandboxes and len(held) > quota.max_sandboxes:
            msg = (
                f"quota: at most {quota.max_sandboxes} sandboxes (running and paused); "
                "kill some first"
            )
            raise QuotaExceeded(msg, retry_after=COUNT_RETRY_AFTER, retryable=False)
        active = sum(1 for r in held if states.counts_as_running(r.state))
        if quota.max_running and active > quota.max_running:
            msg = f"quota: at most {quota.max_running} running sandboxes; pause or kill some first"
            raise QuotaExceeded(msg, retry_after=COUNT_RETRY_AFTER, retryable=False)

    async def before_resume(self, record: SandboxRecord) -> None:
        quota = await self.quota_of(record.owner)
        active = sum(1 for r in await self._held(record.owner) if states.counts_as_running(r.state))
        if quota.max_running and active >= quota.max_running:
            msg = f"quota: at most {quota.max_running} running sandboxes; pause or kill some first"
            raise QuotaExceeded(msg, retry_after=COUNT_RETRY_AFTER, retryable=False)
        await self._rates.take(
            "resume", record.owner, per_minute=quota.resumes_per_minute, burst=quota.resume_burst
        )
