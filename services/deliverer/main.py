"""``python -m services.deliverer.main``: the webhook delivery worker (docs/webhooks.md).

Serves ``/livez``, ``/readyz`` (NATS connected) and ``/metrics`` on ``TORPOR_HEALTH_PORT``
(default 8085, or ``--health-port``). Stops gracefully on SIGTERM/SIGINT.
"""

from __future__ import annotations

from services.deliverer.bootstrap import deliverer_host
from services.deliverer.settings import DelivererSettings
from shared.lifecycle.entry import WorkerSpec, run_worker
from shared.settings import load
from shared.webhooks.settings import WebhookPolicySettings

SPEC = WorkerSpec(
    "deliverer",
    lambda: (load(DelivererSettings), load(WebhookPolicySettings)),
    deliverer_host,
    health_port=8085,
)


def main(argv: list[str] | None = None) -> int:
    return run_worker(SPEC, argv)


if __name__ == "__main__":
    raise SystemExit(main())
