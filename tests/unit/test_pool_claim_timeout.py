"""``TORPOR_POOL_CLAIM_TIMEOUT`` (shared/settings.py ``RuntimeSettings.pool_claim_timeout``): the
age after which the scaler on Kubernetes deletes a pool pod whose claimer died mid-claim. Hostile
and out-of-range values are one readable line naming the variable (the services exit 2 on it);
the scaler's runtime sweeps with it (shared/runtime/factory.py)."""

from __future__ import annotations

import pytest

from shared.errors import ConfigError
from shared.settings import RuntimeSettings, load

pytestmark = pytest.mark.unit

VARIABLE = "TORPOR_POOL_CLAIM_TIMEOUT"


def test_default_and_a_valid_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(VARIABLE, raising=False)
    assert load(RuntimeSettings).pool_claim_timeout == 60.0
    monkeypatch.setenv(VARIABLE, "2.5")
    assert load(RuntimeSettings).pool_claim_timeout == 2.5


@pytest.mark.parametrize(
    "value",
    [
        "0",  # every claim would be swept as abandoned while it runs
        "0.5",
        "-1",
        "3601",  # an orphan pod kept for hours
        "1e309",
        "inf",
        "nan",
        "--ro-bind",
        "60\x01",
        "60 s",
        "",
        "9" * 5000,
    ],
)
def test_a_hostile_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(VARIABLE, value)
    with pytest.raises(ConfigError) as caught:
        load(RuntimeSettings)
    message = str(caught.value)
    assert "\n" not in message and VARIABLE in message
    assert len(message) < 200  # the value is not echoed back
