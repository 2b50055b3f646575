"""``.venv/bin/python scripts/asyncapi.py``: regenerate the AsyncAPI documents in docs/asyncapi/.

A script, not a module of ``shared``: it needs the services' routers, and shared code never
imports a service (``.importlinter``).
"""

from __future__ import annotations

from pathlib import Path

from services.deliverer import asyncapi as deliverer_doc
from services.ledger import asyncapi as ledger_doc
from services.scaler import asyncapi as scaler_doc
from services.snapshotter import asyncapi as snapshotter_doc
from shared.bus.asyncapi import render
from shared.models.messages import (
    CreateSandbox,
    KillSandbox,
    ResumeSandbox,
    SandboxCreated,
    SandboxExpired,
    SandboxExpiring,
    SandboxFailed,
    SandboxHookRan,
    SandboxKilled,
    SandboxPaused,
    SandboxResumed,
    SandboxTimeoutSet,
    SetSandboxNetwork,
    SnapshotTaken,
)
from shared.models.webhooks import DeliveryJob


def main() -> None:
    """Regenerate docs/asyncapi/{snapshotter,scaler,deliverer,ledger}.json (from the
    repository root)."""
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
    public = (
        SandboxCreated,
        SandboxPaused,
        SandboxResumed,
        SandboxKilled,
        SandboxTimeoutSet,
        SnapshotTaken,
        SandboxFailed,
        SandboxExpired,
        SandboxExpiring,
        SandboxHookRan,
    )
    (out / "deliverer.json").write_text(
        render(
            deliverer_doc.app(),
            commands={"sandbox.evt.* (deliverer)": public, "webhook.delivery.*": (DeliveryJob,)},
        )
    )
    metered = (SandboxCreated, SandboxPaused, SandboxResumed, SandboxKilled, SandboxFailed)
    (out / "ledger.json").write_text(
        render(ledger_doc.app(), commands={"sandbox.evt.* (ledger)": metered})
    )


if __name__ == "__main__":
    main()
