"""``python -m services.cli.settings_doc [--check]``: the tables of docs/configuration.md, from
the settings classes.

Each table sits between ``<!-- settings:<Class> -->`` and ``<!-- /settings -->`` in the doc; the
prose around them is written by hand. A row per field read from the environment (tuning
constants, ``shared.settings.constant``, are not): its variable(s), its default and its
docstring. ``--count`` prints how many variables there are. ``--check`` changes nothing and
exits 1 if the doc and the classes disagree (tests/unit/test_settings_doc.py runs it).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Any

from pydantic import AliasChoices, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings

from services.api.settings import ApiSettings
from services.builder.settings import BuilderSettings
from services.cli.settings import UpSettings
from services.deliverer.settings import DelivererSettings
from services.ledger.settings import LedgerSettings
from services.proxy.settings import ProxySettings
from services.scaler.settings import ScalerSettings
from services.scheduler.settings import SchedulerSettings
from services.snapshotter.settings import SnapshotterSettings
from shared.quota.models import QuotaSettings
from shared.runtime.factory import LocalRuntimeSettings
from shared.settings import (
    FORMER_NAMES,
    TUNABLE,
    BusSettings,
    FeatureFlags,
    HealthSettings,
    LoggingSettings,
    RetentionSettings,
    RuntimeSettings,
    TuningSettings,
    is_constant,
)
from shared.web.limits import HttpLimits
from shared.webhooks.settings import WebhookPolicySettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

# Every settings class torpor reads, in the order of the doc.
CLASSES: tuple[type[BaseSettings], ...] = (
    BusSettings,
    LoggingSettings,
    FeatureFlags,
    RuntimeSettings,
    LocalRuntimeSettings,
    HealthSettings,
    RetentionSettings,
    ApiSettings,
    ProxySettings,
    HttpLimits,
    QuotaSettings,
    SchedulerSettings,
    SnapshotterSettings,
    ScalerSettings,
    WebhookPolicySettings,
    DelivererSettings,
    LedgerSettings,
    BuilderSettings,
    UpSettings,
    TuningSettings,
)

_BLOCK = re.compile(r"(<!-- settings:(\w+) -->\n)(.*?)(<!-- /settings -->)", re.S)


def env_names(cls: type[BaseSettings], name: str, field: FieldInfo) -> list[str]:
    """The environment variables a field reads, the preferred one first."""
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return [str(choice) for choice in alias.choices]
    if isinstance(alias, str):
        return [alias]
    return [f"{cls.model_config.get('env_prefix', '')}{name}".upper()]


def _default(value: Any) -> str:
    if value is None or (isinstance(value, SecretStr) and not value.get_secret_value()):
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, float):
        return f"`{value:g}`"
    if isinstance(value, Path):
        return f"`{str(value).replace(str(Path.home()), '~')}`"
    if value == "":
        return "empty"
    return f"`{value}`"


def _variables(names: list[str]) -> str:
    first, rest = names[0], names[1:]
    out = f"`{first}`"
    others = [n for n in rest if n not in FORMER_NAMES]
    former = [n for n in rest if n in FORMER_NAMES]
    if others:
        out += " (or " + ", ".join(f"`{n}`" for n in others) + ")"
    if former:
        out += " (formerly " + ", ".join(f"`{n}`" for n in former) + ", still read)"
    return out


def environment_fields(cls: type[BaseSettings]) -> dict[str, FieldInfo]:
    """The fields read from the environment: all but the tuning constants
    (``shared.settings.constant``)."""
    return {name: f for name, f in cls.model_fields.items() if not is_constant(f)}


def variables() -> set[str]:
    """Every environment variable a setting reads by its current name (former names aside)."""
    return {
        env_names(cls, name, field)[0]
        for cls in CLASSES
        for name, field in environment_fields(cls).items()
    }


def _meaning(cls: type[BaseSettings], name: str, field: FieldInfo) -> str:
    meaning = field.description or ""
    if cls is TuningSettings and name == "tuning":  # the names come from their one list
        meaning += " The names: " + ", ".join(f"`{n}`" for n in sorted(TUNABLE)) + "."
    return meaning


def table(cls: type[BaseSettings]) -> str:
    fields = environment_fields(cls)
    if not fields:
        return f"No environment settings: the defaults are constants in `{cls.__module__}`.\n"
    rows = ["| Variable | Default | Meaning |", "|---|---|---|"]
    for name, field in fields.items():
        meaning = " ".join((_meaning(cls, name, field)).split()).replace("|", "\\|")
        variables = _variables(env_names(cls, name, field))
        rows.append(f"| {variables} | {_default(field.default)} | {meaning} |")
    return "\n".join(rows) + "\n"


def render(doc: str) -> str:
    by_name = {cls.__name__: cls for cls in CLASSES}

    def fill(match: re.Match[str]) -> str:
        cls = by_name.get(match.group(2))
        if cls is None:
            msg = f"docs/configuration.md names an unknown settings class {match.group(2)}"
            raise SystemExit(msg)
        return f"{match.group(1)}{table(cls)}{match.group(4)}"

    return _BLOCK.sub(fill, doc)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="settings_doc", description=__doc__)
    parser.add_argument("--check", action="store_true", help="exit 1 if the doc is stale")
    parser.add_argument("--count", action="store_true", help="print how many variables there are")
    args = parser.parse_args(argv)
    if args.count:
        print(len(variables()))
        return 0
    current = DOC.read_text()
    wanted = render(current)
    if args.check:
        if wanted != current:
            print(
                "docs/configuration.md is stale: python -m services.cli.settings_doc",
                file=sys.stderr,
            )
            return 1
        return 0
    DOC.write_text(wanted)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
