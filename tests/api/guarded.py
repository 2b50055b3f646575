"""The API over a fake lifecycle under the production server (protocol and limits), for the
tests of what the server itself enforces: deadlines, trusted proxies."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from services.api.app import create_app
from services.api.deps import Wiring
from services.api.settings import ApiSettings
from shared.web.limits import HttpLimits
from tests.api.fakes import FakeKeys, FakeLifecycle
from tests.security.rawhttp import serve_guarded


@contextlib.contextmanager
def guarded_api(settings: ApiSettings, limits: HttpLimits, alice_key: str) -> Iterator[str]:
    """The API's URL; ``alice_key`` is alice's API key."""
    keys = FakeKeys()
    keys.add(alice_key, "alice")
    app = create_app(
        settings,
        wiring=Wiring(settings=settings, lifecycle=FakeLifecycle(), keys=keys),
        limits=limits,
    )
    with serve_guarded(app, limits) as url:
        yield url
