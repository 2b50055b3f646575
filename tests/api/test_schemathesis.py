"""Schema-driven fuzzing of /openapi.json (bounded examples): no request makes the API answer
5xx, and responses match the documented schemas and status codes."""

from __future__ import annotations

import asyncio
import atexit
import shutil
import tempfile
from pathlib import Path

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from services.api.app import create_app
from services.api.deps import Wiring
from services.api.settings import ApiSettings
from services.api.template_builds import TemplateBuilds
from shared.lifecycle.event_query import EventQuery
from shared.lifecycle.webhooks import WebhookRegistry
from shared.ports.lifecycle import CreateRequest
from shared.webhooks.addresses import AddressPolicy
from tests.api.fakes import FakeKeys, FakeLifecycle, FakeSnapshots
from tests.fakes.events import InMemoryEventLog
from tests.fakes.publisher import RecordingPublisher
from tests.fakes.store import InMemorySandboxStore
from tests.fakes.templates import FakeTemplateStore
from tests.fakes.usage import InMemoryUsage
from tests.fakes.webhooks import FakeResolver, InMemoryDeliveryLog, InMemoryWebhooks

_KEY = "torpor_fuzz_key"


def _scratch() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="torpor-fuzz-blobs-"))
    atexit.register(shutil.rmtree, folder, True)
    return folder


def _app() -> object:
    lifecycle = FakeLifecycle()
    keys = FakeKeys()
    keys.add(_KEY, "fuzzer")
    # A few real sandboxes so that some generated ids hit something.
    for name in ("a", "b0", "sandbox-01"):
        asyncio.run(lifecycle.create(CreateRequest(owner="fuzzer", sandbox_id=name)))
    cfg = ApiSettings()
    builds = TemplateBuilds(
        store=FakeTemplateStore(),
        publisher=RecordingPublisher(),
        blobs=_scratch(),
        signer_key=b"fuzz",
    )
    wiring = Wiring(
        settings=cfg,
        lifecycle=lifecycle,
        keys=keys,
        snapshots=FakeSnapshots(lifecycle),
        events=EventQuery(InMemoryEventLog(), InMemorySandboxStore()),
        webhooks=WebhookRegistry(
            InMemoryWebhooks(),
            InMemoryDeliveryLog(),
            policy=AddressPolicy(),
            resolver=FakeResolver(),
        ),
        usage=InMemoryUsage(),
        builds=builds,
    )
    return create_app(cfg, wiring=wiring)


# The dashboard's routes (``/dashboard/...``, ``.../events``) live in the same app but belong to
# the dashboard and need a bus connection; they are fuzzed by the dashboard's own tests.
schema = schemathesis.openapi.from_asgi("/openapi.json", _app()).exclude(
    path_regex=r"^/dashboard|/events$"
)


@schema.parametrize()
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
def test_openapi_fuzz(case: schemathesis.Case) -> None:
    case.call_and_validate(
        headers={"X-API-KEY": _KEY},
        checks=[
            not_a_server_error,
            status_code_conformance,
            response_schema_conformance,
            content_type_conformance,
        ],
    )
