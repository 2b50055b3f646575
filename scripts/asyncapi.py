"""``.venv/bin/python scripts/asyncapi.py``: regenerate the AsyncAPI documents in docs/asyncapi/.

A script, not a module of ``shared``: it needs the services' routers, and shared code never
imports a service (``.importlinter``).
"""

from __future__ import annotations

from pathlib import Path

from services.scaler import asyncapi as scaler_doc
from services.snapshotter import asyncapi as snapshotter_doc
from shared.bus.asyncapi import render
from shared.models.messages import CreateSandbox, KillSandbox, ResumeSandbox, SetSandboxNetwork


def main() -> None:
    """Regenerate docs/asyncapi/{snapshotter,scaler}.json (run from the repository root)."""
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
