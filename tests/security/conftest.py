"""One real torpor stack (nats-server + the five services on the local runtime) shared by the
security tests that need real sandboxes; quotas are set per user in the tests themselves."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import skip_or_fail
from tests.e2e.stack import Stack, need_bwrap, running_stack
from tests.security.network_support import outside_host

__all__ = ["outside_host"]  # the pod network tests' fixture


@pytest.fixture(scope="session")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if reason := need_bwrap():
        skip_or_fail(reason)
    try:
        with running_stack(tmp_path_factory.mktemp("security")) as s:
            yield s
    except RuntimeError as e:
        skip_or_fail(f"the torpor stack did not start: {e}")
