"""Settings: docs/configuration.md agrees with the classes, every knob is documented, no variable
feeds two knobs by accident, per-service names win over the former shared ones, and bad values
are one readable line."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from services.builder.settings import BuilderSettings
from services.cli import settings_doc
from services.deliverer.settings import DelivererSettings
from services.scaler.settings import ScalerSettings
from services.scheduler.settings import SchedulerSettings
from services.snapshotter.settings import SnapshotterSettings
from shared.errors import ConfigError
from shared.settings import (
    FORMER_NAMES,
    TUNABLE,
    RetentionSettings,
    TuningSettings,
    is_constant,
    load,
    parse_tuning,
    tuning_key,
)

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[2]

# Deliberately read by two classes: `torpor up` hands each public service TORPOR_HOST/PORT, and
# its own proxy port is the proxy's port.
SHARED_ON_PURPOSE = {"TORPOR_HOST", "TORPOR_PORT", "TORPOR_PROXY_PORT"}


def test_the_doc_is_generated_from_the_classes() -> None:
    doc = settings_doc.DOC.read_text()
    assert settings_doc.render(doc) == doc, "run: python -m services.cli.settings_doc"
    shown = set(re.findall(r"<!-- settings:(\w+) -->", doc))
    assert shown == {cls.__name__ for cls in settings_doc.CLASSES}


def test_every_settings_class_is_in_the_doc_and_every_field_documented() -> None:
    declared = set()
    for path in [*ROOT.glob("shared/**/*.py"), *ROOT.glob("services/**/*.py")]:
        declared |= set(
            re.findall(r"^class (\w+)\((?:SettingsBase|BaseSettings)\)", path.read_text(), re.M)
        )
    declared.discard("SettingsBase")
    assert declared == {cls.__name__ for cls in settings_doc.CLASSES}
    for cls in settings_doc.CLASSES:
        for name, field in cls.model_fields.items():
            assert field.description, f"{cls.__name__}.{name} has no docstring"


def test_no_variable_feeds_two_knobs_except_on_purpose() -> None:
    readers = defaultdict(list)
    for cls in settings_doc.CLASSES:
        for name, field in settings_doc.environment_fields(cls).items():
            for env in settings_doc.env_names(cls, name, field):
                readers[env].append(f"{cls.__name__}.{name}")
    shared = {env for env, fields in readers.items() if len(fields) > 1}
    assert shared - FORMER_NAMES == SHARED_ON_PURPOSE


def test_per_service_names_win_and_former_names_are_still_read(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORPOR_READY_TIMEOUT", "3")
    monkeypatch.setenv("TORPOR_SCALER_READY_TIMEOUT", "4")
    monkeypatch.setenv("TORPOR_RETENTION_SECONDS", "120")
    assert load(ScalerSettings).ready_timeout == 4
    assert load(RetentionSettings).retention_seconds == 120
    monkeypatch.delenv("TORPOR_SCALER_READY_TIMEOUT")
    assert load(ScalerSettings).ready_timeout == 3
    monkeypatch.delenv("TORPOR_READY_TIMEOUT")
    assert load(ScalerSettings).ready_timeout == 60


def test_a_tuning_constant_is_never_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``shared.settings.constant``: set in code only, whatever the environment holds (its own
    name, a former name or garbage), and still validated when code sets it."""
    for name in ("TORPOR_SCALER_MAX_WORKERS", "TORPOR_MAX_WORKERS", "TORPOR_SCHEDULER_MAX_WORKERS"):
        monkeypatch.setenv(name, "--ro-bind")
    monkeypatch.setenv("TORPOR_SCALER_READY_TIMEOUT", "7")
    scaler, scheduler = load(ScalerSettings), load(SchedulerSettings)
    assert (scaler.max_workers, scaler.ready_timeout, scheduler.max_workers) == (8, 7.0, 2)
    assert ScalerSettings(max_workers=3).max_workers == 3
    with pytest.raises(ValueError, match="max_workers"):
        ScalerSettings(max_workers=0)
    variables = settings_doc.variables()
    assert (
        "TORPOR_SCALER_MAX_WORKERS" not in variables and "TORPOR_SCALER_READY_TIMEOUT" in variables
    )
    assert "TORPOR_SCALER_MAX_WORKERS" not in settings_doc.DOC.read_text()


@pytest.mark.parametrize("value", ["0", "--ro-bind", "-1", "1.5", "", "1e999"])
def test_a_bad_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TORPOR_DELIVERER_MAX_ATTEMPTS", value)
    with pytest.raises(ConfigError) as caught:
        load(DelivererSettings)
    message = str(caught.value)
    assert "\n" not in message and "max_attempts" in message


# ---- TORPOR_TUNING: the constants tests set in the services they start ---------------------------


def test_every_tunable_is_a_constant_of_a_settings_class_and_documented() -> None:
    keys = {
        tuning_key(cls, name)
        for cls in settings_doc.CLASSES
        for name, field in cls.model_fields.items()
        if is_constant(field)
    }
    assert keys >= TUNABLE
    row = next(r for r in settings_doc.table(TuningSettings).splitlines() if "TORPOR_TUNING" in r)
    listed = set(re.findall(r"`([A-Z_]+)`", row.partition("The names:")[2]))
    assert listed == TUNABLE
    assert not TUNABLE & {e.removeprefix("TORPOR_") for e in settings_doc.variables()}


def test_torpor_tuning_sets_a_tunable_constant_of_its_own_section_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "TORPOR_TUNING", " SCALER_GIVE_UP_AFTER=4 ,BUILDER_GC_GRACE=1,STOP_GRACE=5,,"
    )
    # the knobs' former variables are read no more
    monkeypatch.setenv("TORPOR_SCALER_GIVE_UP_AFTER", "7")
    monkeypatch.setenv("TORPOR_GIVE_UP_AFTER", "8")
    monkeypatch.setenv("TORPOR_SCHEDULER_FETCH_BATCH", "9")
    assert load(ScalerSettings).give_up_after == 4
    assert load(SnapshotterSettings).give_up_after == 5
    assert load(SchedulerSettings).fetch_batch == 500
    assert (load(BuilderSettings).gc_grace, load(BuilderSettings).gc_interval) == (1.0, 300.0)
    assert ScalerSettings(give_up_after=2).give_up_after == 2  # code still wins


@pytest.mark.parametrize(
    "value",
    [
        "SCALER_MAX_WORKERS=3",  # a constant, but not a tunable
        "SCALER_READY_TIMEOUT=4",  # a setting: set by its own variable
        "TORPOR_SCALER_GIVE_UP_AFTER=4",
        "scaler_give_up_after=4",
        "SCALER_GIVE_UP_AFTER",
        "=4",
        "--ro-bind",
        "SCALER_GIVE_UP_AFTER=4,SCALER_GIVE_UP_AFTER=5",
        "SCALER_GIVE_UP_AFTER:4",
        "SCALER_GIVE_UP_AFTER=4," + "x" * 5000,
    ],
)
def test_a_bad_torpor_tuning_stops_every_service_with_one_line(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TORPOR_TUNING", value)
    for cls in (ScalerSettings, SnapshotterSettings, RetentionSettings, TuningSettings):
        with pytest.raises(ConfigError) as caught:
            load(cls)
        message = str(caught.value)
        assert "\n" not in message and "TORPOR_TUNING" in message
        assert len(message) < 300


@pytest.mark.parametrize("value", ["0", "11", "--ro-bind", "", "1.5", "1e999", "4;STOP_GRACE=1"])
def test_a_bad_tuned_value_is_refused_like_a_setting(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("TORPOR_TUNING", f"SCALER_GIVE_UP_AFTER={value}")
    with pytest.raises(ConfigError) as caught:
        load(ScalerSettings)
    message = str(caught.value)
    assert "\n" not in message and "give_up_after" in message
    assert load(SnapshotterSettings).give_up_after == 5  # another section's knob: not its own


def test_a_nul_in_a_tuning_name_is_refused() -> None:
    with pytest.raises(ValueError, match="expected NAME=VALUE"):
        parse_tuning("SCALER_GIVE_UP_AFTER\x00=4")
