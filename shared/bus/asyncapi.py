"""AsyncAPI documents of the lifecycle workers, generated from their real routers.

``faststream docs gen services.scaler.asyncapi:app --factory``, or ``scripts/asyncapi.py`` for
every document in docs/asyncapi/ (see docs/bus.md). The routers are
built over inert ports: only their subscribers and publishers are inspected.
"""

from __future__ import annotations

import json

from faststream import FastStream
from faststream.nats import NatsBroker, NatsRouter
from faststream.specification import AsyncAPI
from pydantic import BaseModel


def document(router: NatsRouter, *, title: str, description: str) -> FastStream:
    broker = NatsBroker("nats://127.0.0.1:4222", description="torpor bus (NATS JetStream)")
    broker.include_router(router)
    return FastStream(
        broker,
        specification=AsyncAPI(title=title, version="1", description=description),
    )


def render(
    app: FastStream, *, commands: dict[str, tuple[type[BaseModel], ...]] | None = None
) -> str:
    """The AsyncAPI JSON; ``commands`` (channel title → model) documents the payloads of a
    subscriber that takes several command types on one durable and dispatches by subject."""
    assert app.schema is not None
    doc = json.loads(app.schema.to_specification().to_json())
    schemas = doc["components"]["schemas"]
    for channel_title, models in (commands or {}).items():
        refs = []
        for model in models:
            flat = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in flat.pop("$defs", {}).items():
                schemas.setdefault(name, sub)
            schemas[model.__name__] = flat
            refs.append({"$ref": f"#/components/schemas/{model.__name__}"})
        for key, schema in schemas.items():
            if key.startswith(f"{channel_title}:"):
                schema["oneOf"] = refs
                schema["description"] = "Chosen by the subject's verb (create/resume/kill/network)."
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"
