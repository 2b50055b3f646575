"""What a scaler operation tells about itself: the path its pod came by, the durations of a
resume's phases (the ``resume_timing`` log line) and the resume report kept on the record and
carried by the ``resumed`` event."""

from __future__ import annotations

from shared.domain import transitions as t
from shared.domain.record import SandboxRecord
from shared.models.lifecycle import TemplateFacts
from shared.models.messages import (
    REPORT_PROCESS_BYTES,
    ProcessOutcome,
    ResumeReport,
    ResumeTimings,
    StartPath,
)
from shared.ports.workloads import Endpoint
from shared.spans import Spans as BaseSpans


def path_of(endpoint: Endpoint) -> StartPath:
    """How the pod came: from a warm pool, or started for this sandbox."""
    return "warm" if endpoint.warm else "cold"


class Spans(BaseSpans):
    """A resume's phases, and the resume report's view of them."""

    def timings(self) -> ResumeTimings:
        """The report's view: the pod (scale, ready), the replay (list, start, mark), the
        postResume hooks."""
        return ResumeTimings(
            claim_ms=self.of("claim"),
            pod_ms=self.of("workload", "scale", "ready"),
            files_ms=0.0,  # a resume's files are kept in place: mounted with the pod
            replay_ms=self.of("replay_list", "replay_start", "replay_mark"),
            hooks_ms=self.of("hooks"),
            total_ms=self.as_ms()["total_ms"],
        )


# What a replayed resume loses (a files-only pause, or a memory pause whose dump or restore
# failed: the runtime's ``Endpoint.memory_note`` then follows, docs/memory-pause.md).
REPLAYED = (
    "memory not kept: each process was started again from its command line, so its variables, "
    "a kernel's state and open connections are gone (files are kept as filesKept says)"
)


def within_budget(
    outcomes: list[ProcessOutcome], budget: int = REPORT_PROCESS_BYTES
) -> list[ProcessOutcome]:
    """The outcomes, in order, as long as they fit ``budget`` bytes of JSON (the record holds the
    report next to a snapshot of up to 200 KiB, under the bucket's 256 KiB value limit)."""
    listed: list[ProcessOutcome] = []
    used = 0
    for outcome in outcomes:
        used += len(outcome.model_dump_json())
        if used > budget:
            break
        listed.append(outcome)
    return listed


def resume_report(
    record: SandboxRecord,
    snapshot_id: str | None,
    outcomes: list[ProcessOutcome],
    facts: TemplateFacts,
    timings: ResumeTimings,
    *,
    path: StartPath,
    memory: Endpoint | None = None,
) -> ResumeReport:
    """``memory``: the resumed pod; ``memory_kept`` when it is the paused tree restored (no
    replay), else the replay's note and the runtime's reason, if it gave one."""
    listed = within_budget(outcomes)
    kept = memory is not None and memory.memory_kept
    note = None if kept else REPLAYED
    if not kept and memory is not None and memory.memory_note:
        note = f"{REPLAYED}; {memory.memory_note}"
    return ResumeReport(
        at=t.now(),
        path=path,
        snapshot_id=snapshot_id,
        template=record.template,
        template_version=facts.version,
        files_kept=facts.keeps_files,
        memory_kept=kept,
        memory_note=note,
        processes=listed,
        omitted=len(outcomes) - len(listed),
        replayed=sum(1 for o in outcomes if o.new_pid is not None),
        failed=sum(1 for o in outcomes if o.error is not None),
        timings=timings,
    )
