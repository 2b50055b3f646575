"""Settings: docs/configuration.md agrees with the classes, every knob is documented, no variable
feeds two knobs by accident, per-service names win over the former shared ones, and bad values
are one readable line."""

from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import pytest

from services.cli import settings_doc
from services.scaler.settings import ScalerSettings
from services.scheduler.settings import SchedulerSettings
from services.snapshotter.settings import SnapshotterSettings
from shared.errors import ConfigError
from shared.settings import FORMER_NAMES, RetentionSettings, load

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
    monkeypatch.setenv("TORPOR_GIVE_UP_AFTER", "3")
    monkeypatch.setenv("TORPOR_SCALER_GIVE_UP_AFTER", "4")
    monkeypatch.setenv("TORPOR_RETENTION_SECONDS", "120")
    assert load(ScalerSettings).give_up_after == 4
    assert load(SnapshotterSettings).give_up_after == 3
    assert load(RetentionSettings).retention_seconds == 120
    monkeypatch.delenv("TORPOR_GIVE_UP_AFTER")
    assert load(SnapshotterSettings).give_up_after == 5


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
    monkeypatch.setenv("TORPOR_SCALER_GIVE_UP_AFTER", value)
    with pytest.raises(ConfigError) as caught:
        load(ScalerSettings)
    message = str(caught.value)
    assert "\n" not in message and "TORPOR_SCALER_GIVE_UP_AFTER" in message
