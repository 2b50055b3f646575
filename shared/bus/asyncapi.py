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
        verbs = [_verb(m) for m in models]
        for model in models:
            flat = model.model_json_schema(ref_template="#/components/schemas/{model}")
            for name, sub in flat.pop("$defs", {}).items():
                schemas.setdefault(name, sub)
            schemas[model.__name__] = flat
            refs.append({"$ref": f"#/components/schemas/{model.__name__}"})
        described = f"Chosen by the subject's verb ({'/'.join(verbs)})."
        for key, message in doc["components"].get("messages", {}).items():
            # A subscriber taking the raw message has no payload schema of its own.
            empty = message.get("payload") == {"$ref": "#/components/schemas/EmptyPayload"}
            if key.startswith(f"{channel_title}:") and empty:
                message["payload"] = {"oneOf": refs, "description": described}
        for key, schema in schemas.items():
            if key.startswith(f"{channel_title}:"):
                schema["oneOf"] = refs
                schema["description"] = f"Chosen by the subject's verb ({'/'.join(verbs)})."
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def _verb(model: type[BaseModel]) -> str:
    """``sandbox.cmd.create`` -> ``create``; a model without a ``type`` by its name."""
    field = model.model_fields.get("type")
    kind = str(field.default) if field is not None and field.default else model.__name__
    return kind.rsplit(".", 1)[-1]
