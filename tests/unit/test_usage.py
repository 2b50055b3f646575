"""The usage ledger's arithmetic and its exactly-once rule, with fakes: a scripted lifecycle
gives the exact seconds, duplicates (redelivered, re-published) change nothing, each sandbox is
weighed by its own template's size (fixed at its first event), the default when unreadable."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from services.ledger.metering import Ledger
from services.ledger.sizes import TemplateSizes
from shared.domain.record import SandboxRecord
from shared.errors import ConfigError, NotFound
from shared.models.messages import (
    ProcessOutcome,
    SandboxCreated,
    SandboxFailed,
    SandboxKilled,
    SandboxPaused,
    SandboxResumed,
)
from shared.models.usage import MIB, Size
from shared.runtime.template_sizes import TemplateSize, read_size
from tests.fakes.store import InMemorySandboxStore
from tests.fakes.usage import InMemoryUsage

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
SIZE = Size(cpu=2, memory_mb=512, kept_bytes=1024 * MIB)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


class FakeTemplates:
    """Template sizes by name; counts reads; a name missing is NotFound, "broken" a ConfigError."""

    def __init__(self, sizes: dict[str, TemplateSize]) -> None:
        self.sizes = sizes
        self.reads = 0

    def __call__(self, name: str) -> TemplateSize:
        self.reads += 1
        if name == "broken":
            raise ConfigError("template broken.yaml: not YAML")
        if name not in self.sizes:
            raise NotFound(f"template {name!r} not found")
        return self.sizes[name]


SANDBOXES = (("s1", "alice", "t"), ("s2", "alice", "t"), ("s3", "bob", "t"))


async def ledger(
    templates: FakeTemplates | None = None,
    sandboxes: tuple[tuple[str, str, str], ...] = SANDBOXES,
) -> tuple[Ledger, InMemoryUsage]:
    records = InMemorySandboxStore()
    for sid, owner, template in sandboxes:
        await records.create(
            SandboxRecord(
                sandbox_id=sid,
                owner=owner,
                template=template,
                created_at=T0,
                started_at=T0,
                updated_at=T0,
            )
        )
    usage = InMemoryUsage()
    sizes = TemplateSizes(templates or FakeTemplates({}), SIZE)
    return Ledger(records=records, usage=usage, sizes=sizes), usage


class Stream:
    """Events as the stream stores them: subject, body, message id, sequence."""

    def __init__(self, led: Ledger) -> None:
        self.led = led
        self.seq = 0

    async def send(self, event: object, *, again: int | None = None) -> str:
        if again is None:
            self.seq += 1
        seq = again if again is not None else self.seq
        kind = str(event.type).rsplit(".", 1)[-1]  # type: ignore[attr-defined]
        sid, gen = event.sandbox_id, event.generation  # type: ignore[attr-defined]
        return await self.led.on_event(
            f"sandbox.evt.{kind}.{sid}",
            event.model_dump_json().encode(),  # type: ignore[attr-defined]
            msg_id=f"{kind}:{sid}:g{gen}",
            seq=seq,
        )


async def test_scripted_lifecycle_gives_exact_seconds() -> None:
    led, usage = await ledger()
    stream = Stream(led)
    await stream.send(SandboxCreated(sandbox_id="s1", generation=1, at=at(0)))
    await stream.send(SandboxPaused(sandbox_id="s1", generation=3, at=at(90)))
    await stream.send(
        SandboxResumed(
            sandbox_id="s1",
            generation=5,
            at=at(90 + 600),
            processes=[
                ProcessOutcome(cmd="a", args=[], old_pid=1, new_pid=2),
                ProcessOutcome(cmd="b", args=[], old_pid=3, error="exec failed"),
            ],
        )
    )
    await stream.send(SandboxKilled(sandbox_id="s1", generation=6, at=at(90 + 600 + 30.5)))
    (u, _) = usage.entries[("alice", "s1")]
    assert u.state == "stopped"
    assert u.running_seconds == 120.5
    assert u.paused_seconds == 600
    assert u.cpu_seconds == 241.0
    assert u.memory_mb_seconds == 120.5 * 512
    assert u.kept_byte_seconds == 600 * 1024 * MIB
    assert (u.resumes, u.replay_failures) == (1, 1)
    running = led.metrics.registry.get_sample_value(
        "torpor_usage_running_seconds", {"user": "alice"}
    )
    assert running is not None and running >= 120.5


async def test_duplicates_change_nothing() -> None:
    led, usage = await ledger()
    stream = Stream(led)
    created = SandboxCreated(sandbox_id="s2", generation=1, at=at(0))
    paused = SandboxPaused(sandbox_id="s2", generation=2, at=at(10))
    assert await stream.send(created) == "created"
    assert await stream.send(created, again=1) == "duplicate"  # redelivered: same sequence
    assert await stream.send(paused) == "paused"
    assert await stream.send(paused) == "duplicate"  # re-published: new sequence, same id
    assert await stream.send(SandboxKilled(sandbox_id="s2", generation=3, at=at(25))) == "killed"
    (u, _) = usage.entries[("alice", "s2")]
    assert (u.running_seconds, u.paused_seconds) == (10, 15)


async def test_a_failed_pause_keeps_counting_running_time_and_open_intervals_show_on_read() -> None:
    led, usage = await ledger()
    stream = Stream(led)
    await stream.send(SandboxCreated(sandbox_id="s3", generation=1, at=at(0)))
    await stream.send(
        SandboxFailed(sandbox_id="s3", generation=2, at=at(5), op="pause", reason="envd")
    )
    (u, _) = usage.entries[("bob", "s3")]
    assert u.state == "running" and u.running_seconds == 0
    now = u.as_of(at(42))
    assert now.running_seconds == 42 and now.cpu_seconds == 84
    assert u.running_seconds == 0  # reading does not store


async def test_unknown_sandbox_and_internal_facts_are_skipped() -> None:
    led, usage = await ledger()
    assert await led.on_event("sandbox.evt.created.nope", b"{}", msg_id="x", seq=1) == (
        "unattributed"
    )
    body = SandboxPaused(sandbox_id="s1", generation=1, at=T0).model_dump_json().encode()
    assert await led.on_event("sandbox.evt.activity.s1", body, msg_id="y", seq=2) == "ignored"
    assert usage.entries == {}


SMALL = TemplateSize(cpu=0.5, memory_bytes=256 * MIB, kept_bytes=512 * MIB)
BIG = TemplateSize(cpu=4, memory_bytes=8192 * MIB, kept_bytes=10 * 1024 * MIB)


async def run_and_pause(stream: Stream, sid: str) -> None:
    """100 s running, then 50 s paused, then killed."""
    await stream.send(SandboxCreated(sandbox_id=sid, generation=1, at=at(0)))
    await stream.send(SandboxPaused(sandbox_id=sid, generation=2, at=at(100)))
    await stream.send(SandboxKilled(sandbox_id=sid, generation=3, at=at(150)))


async def test_each_sandbox_is_weighed_by_its_own_templates_size() -> None:
    templates = FakeTemplates(
        {
            "small": SMALL,
            "big": BIG,
            "ephemeral": TemplateSize(cpu=1, memory_bytes=MIB, kept_bytes=0),
            "partial": TemplateSize(cpu=3),  # sets no memory, no disk
        }
    )
    sandboxes = (
        ("a", "alice", "small"),
        ("b", "alice", "big"),
        ("c", "alice", "ephemeral"),
        ("d", "alice", "nope"),
        ("e", "alice", "broken"),
        ("f", "alice", "partial"),
        ("g", "alice", "big"),
    )
    led, usage = await ledger(templates, sandboxes)
    stream = Stream(led)
    for sid, _, _ in sandboxes:
        await run_and_pause(stream, sid)

    def of(sid: str) -> tuple[float, float, float]:
        u = usage.entries[("alice", sid)][0]
        assert (u.running_seconds, u.paused_seconds) == (100, 50)
        return u.cpu_seconds, u.memory_mb_seconds, u.kept_byte_seconds

    assert of("a") == (50, 100 * 256, 50 * 512 * MIB)
    assert of("b") == (400, 100 * 8192, 50 * 10 * 1024 * MIB)
    assert of("c")[2] == 0  # persist: none keeps nothing while paused
    default = (200, 100 * 512, 50 * 1024 * MIB)
    assert of("d") == default  # unknown template: the configured size
    assert of("e") == default  # unreadable template: the configured size
    assert of("f") == (300, 100 * 512, 50 * 1024 * MIB)  # unset figures: the defaults
    # Read at each sandbox's first event only, and "g" found "big" in the cache.
    assert templates.reads == 6
    assert usage.entries[("alice", "g")][0].size == usage.entries[("alice", "b")][0].size


async def test_the_size_is_fixed_at_a_sandboxs_first_event() -> None:
    templates = FakeTemplates({"t": SMALL})
    led, usage = await ledger(templates)
    stream = Stream(led)
    await stream.send(SandboxCreated(sandbox_id="s1", generation=1, at=at(0)))
    # The template changes (and a new ledger process, with an empty cache, reads it).
    templates.sizes["t"] = BIG
    led2 = Ledger(
        records=led._records,  # the same sandbox store, a restarted ledger
        usage=usage,
        sizes=TemplateSizes(templates, SIZE),
    )
    stream.led = led2
    await stream.send(SandboxPaused(sandbox_id="s1", generation=2, at=at(100)))
    await stream.send(SandboxResumed(sandbox_id="s1", generation=3, at=at(150)))
    await stream.send(SandboxKilled(sandbox_id="s1", generation=4, at=at(160)))
    u = usage.entries[("alice", "s1")][0]
    assert u.size == Size(cpu=0.5, memory_mb=256, kept_bytes=512 * MIB)
    assert u.cpu_seconds == 110 * 0.5
    assert u.kept_byte_seconds == 50 * 512 * MIB


def test_packaged_templates_sizes_on_both_runtimes() -> None:
    """The real readers over the packaged templates (local YAML and Kubernetes PodTemplate)."""
    local = read_size("local", None, None, "sandbox-base")
    assert local == TemplateSize(cpu=1, memory_bytes=2 * 1024 * MIB, kept_bytes=2 * 1024 * MIB)
    kube = read_size("kubernetes", None, None, "sandbox-base")
    assert kube == TemplateSize(cpu=1, memory_bytes=2 * 1024 * MIB, kept_bytes=2 * 1024 * MIB)


def test_a_local_template_that_persists_nothing_keeps_zero_bytes(tmp_path: Path) -> None:
    (tmp_path / "fresh.yaml").write_text(
        "persist: none\nresources:\n  limits:\n    cpu: 500m\n    disk: 1Gi\n"
    )
    assert read_size("local", tmp_path, None, "fresh") == TemplateSize(cpu=0.5, kept_bytes=0)
    for hostile in ("../fresh", "--ro-bind", "fresh\x00", "x" * 300):
        try:
            read_size("local", tmp_path, None, hostile)
        except NotFound:
            continue
        raise AssertionError(hostile)


def test_a_user_built_template_is_read_from_the_built_folder(tmp_path: Path) -> None:
    """Local runtime: a built template is ``<build id>.yaml`` under the data dir, with the
    build's cpuCount/memoryMB as its limits (services/builder); the operator's folder wins."""
    build_id = "0b8e5f0c-1d2e-4f3a-9b4c-5d6e7f8a9b0c"
    built, operator = tmp_path / "built", tmp_path / "operator"
    built.mkdir()
    operator.mkdir()
    (built / f"{build_id}.yaml").write_text(
        "resources:\n  limits:\n    cpu: '3'\n    memory: 3072Mi\n    disk: 2Gi\n"
    )
    assert read_size("local", operator, built, build_id) == TemplateSize(
        cpu=3, memory_bytes=3072 * MIB, kept_bytes=2 * 1024 * MIB
    )
    (built / "sandbox-base.yaml").write_text("resources:\n  limits:\n    cpu: '8'\n")
    (operator / "sandbox-base.yaml").write_text("resources:\n  limits:\n    cpu: 250m\n")
    assert read_size("local", operator, built, "sandbox-base").cpu == 0.25
