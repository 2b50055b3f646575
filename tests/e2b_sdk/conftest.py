"""One real torpor stack (nats-server and the five services on the local runtime) for the whole
package: the unmodified ``e2b`` SDK against it, as in ``tests/e2e``."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import skip_or_fail
from tests.e2e.stack import Stack, need_bwrap, running_stack


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if reason := need_bwrap():
        skip_or_fail(reason)
    try:
        with running_stack(tmp_path_factory.mktemp("e2b-sdk")) as s:
            yield s
    except RuntimeError as e:
        skip_or_fail(f"the torpor stack did not start: {e}")


@pytest.fixture(scope="session")
def opts(stack: Stack) -> dict[str, object]:
    env = stack.sdk_env("alice")
    return {
        "api_key": env["E2B_API_KEY"],
        "api_url": env["E2B_API_URL"],
        "sandbox_url": env["E2B_SANDBOX_URL"],
    }
