from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest

from services.api.app import create_app
from services.api.deps import Wiring
from services.api.settings import ApiSettings
from tests.api.fakes import FakeKeys, FakeLifecycle

ALICE = "torpor_alice_key"
BOB = "torpor_bob_key"
ADMIN = "torpor_admin_key"


@pytest.fixture
def lifecycle() -> FakeLifecycle:
    return FakeLifecycle()


@pytest.fixture
def keys() -> FakeKeys:
    k = FakeKeys()
    k.add(ALICE, "alice")
    k.add(BOB, "bob")
    k.add(ADMIN, "root", admin=True)
    return k


@pytest.fixture
def settings() -> ApiSettings:
    return ApiSettings(list_max_limit=3)


@pytest.fixture
async def client(
    settings: ApiSettings, lifecycle: FakeLifecycle, keys: FakeKeys
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, wiring=Wiring(settings=settings, lifecycle=lifecycle, keys=keys))
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://api") as c:
        yield c


def auth(key: str = ALICE) -> dict[str, str]:
    return {"X-API-KEY": key}
