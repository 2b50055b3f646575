"""AsyncAPI documents of the lifecycle workers, generated from their real routers.

``faststream docs gen services.scaler.asyncapi:app --factory`` (see docs/bus.md). The routers are
built over inert ports: only their subscribers and publishers are inspected.
"""

from __future__ import annotations

import json
from pathlib import Path

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


def main() -> None:
    """``python -m shared.lifecycle.spec``: regenerate docs/asyncapi/{snapshotter,scaler}.json."""
    from services.scaler import asyncapi as scaler_doc
    from services.snapshotter import asyncapi as snapshotter_doc
    from shared.models.messages import (
        CreateSandbox,
        KillSandbox,
        ResumeSandbox,
        SetSandboxNetwork,
    )

    out = Path("docs/asyncapi")
    out.mkdir(parents=True, exist_ok=True)
    (out / "snapshotter.json").write_text(render(snapshotter_doc.app()))
    title = "sandbox.cmd.{create,resume,kill,network}"
    (out / "scaler.json").write_text(
        render(
            scaler_doc.app(),
            commands={title: (CreateSandbox, ResumeSandbox, KillSandbox, SetSandboxNetwork)},
        )
    )


if __name__ == "__main__":
    main()
