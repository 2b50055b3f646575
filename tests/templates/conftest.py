"""One stack per module with the builder, build pods offline (``TORPOR_BUILDER_ALLOW_INTERNET=
false``: the network rule; what a build installs comes from its build context)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.fixtures import started
from tests.support.stack import SERVICES, Stack


@pytest.fixture(scope="module")
def tstack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    yield from started(
        Stack(
            tmp_path_factory.mktemp("templates"),
            services=(*SERVICES, "builder"),
            env={
                "TORPOR_BUILDER_ALLOW_INTERNET": "false",
                "TORPOR_BUILDER_DISK": "1Gi",
                # Under the API's create wait (60s): a never-ready create fails, not 504s.
                "TORPOR_SCALER_READY_TIMEOUT": "30",
                # Garbage collection every second, a deleted build's files a second after
                # (test_gc); cache entries and uploads keep their default bounds.
                "TORPOR_TUNING": "BUILDER_GC_INTERVAL=1,BUILDER_GC_GRACE=1",
            },
        )
    )
