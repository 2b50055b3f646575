from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import skip_or_fail
from tests.dashboard.upstack import Up, need_up, torpor_up


@pytest.fixture(scope="session")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    if reason := need_up():
        skip_or_fail(reason)
    try:
        with torpor_up(tmp_path_factory.mktemp("dashboard")) as running:
            yield running
    except RuntimeError as e:
        skip_or_fail(f"torpor up did not start: {e}")
