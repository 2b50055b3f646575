"""How long a pause asks the daemon to hold the sandbox stopped: whole seconds, rounded up, and
only what the daemon accepts (0 to 600); anything else is refused before a request is made."""

from __future__ import annotations

import math

import pytest

from shared.runtime.kubernetes.kept import MAX_HOLD_SECONDS, hold_seconds

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(("hold", "sent"), [(0, 0), (0.2, 1), (120, 120), (599.5, 600)])
def test_a_hold_is_whole_seconds_rounded_up(hold: float, sent: int) -> None:
    assert hold_seconds(hold) == sent


@pytest.mark.parametrize("hold", [-1, -0.001, MAX_HOLD_SECONDS + 0.5, math.inf, math.nan])
def test_a_hold_out_of_range_is_refused(hold: float) -> None:
    with pytest.raises(ValueError, match="hold must be from 0 to 600"):
        hold_seconds(hold)
