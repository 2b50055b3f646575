"""``torpor up``: embedded NATS, the first user and key, then every service under one supervisor."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from urllib.parse import urlsplit

from rich.live import Live

from services.cli import catalog
from services.cli.accounts import ensure_admin_key, open_accounts
from services.cli.instance import InstanceState, remove_state, write_state
from services.cli.status_view import StatusView
from services.cli.supervising import Child, Supervisor
from shared.bus.credentials import OPERATOR, client_env, load_or_create
from shared.bus.server import EmbeddedNats, free_ports, listeners
from shared.runtime.local import procfs
from shared.runtime.local.network import release_instance
from shared.runtime.local.pod_dirs import unmount_stopped
from shared.settings import BusSettings


@dataclass(frozen=True)
class Plan:
    data_dir: Path
    api_port: int
    proxy_port: int
    nats_port: int
    grace: float = 10.0
    host: str = "127.0.0.1"

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.api_port}"

    @property
    def sandbox_url(self) -> str:
        return f"http://{self.host}:{self.proxy_port}"


def child_env(plan: Plan, nats_url: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(
        {
            "NATS_URL": nats_url,
            "TORPOR_DATA_DIR": str(plan.data_dir),
            "TORPOR_API_URL": plan.api_url,
            "TORPOR_SANDBOX_URL": plan.sandbox_url,
            "TORPOR_HEALTH_HOST": plan.host,
        }
    )
    # NATS_URL above wins (never point at another broker); ports and bus credentials are set
    # per service (an operator's exported NATS_USER/NATS_PASSWORD must not leak into them).
    for name in (
        "TORPOR_NATS_URL",
        "TORPOR_PORT",
        "TORPOR_API_PORT",
        "TORPOR_PROXY_PORT",
        *BUS_CREDENTIAL_VARS,
    ):
        env.pop(name, None)
    return env


BUS_CREDENTIAL_VARS = (
    "NATS_USER",
    "NATS_PASSWORD",
    "NATS_CREDS",
    "TORPOR_NATS_USER",
    "TORPOR_NATS_PASSWORD",
    "TORPOR_NATS_CREDS",
)


def service_env(name: str, passwords: dict[str, str]) -> dict[str, str]:
    """A service connects as its own least-privilege user, which may not create streams:
    ``torpor up`` provisions them first, as the operator."""
    return {**client_env(name, passwords), "TORPOR_BUS_PROVISION": "false"}


def control_ports_env(plan: Plan, nats_url: str, children: list[Child]) -> dict[str, str]:
    """Webhooks may never reach this instance's own ports, even where loopback receivers are
    allowed (``shared/webhooks/addresses.py``)."""
    ports = {plan.api_port, plan.proxy_port, urlsplit(nats_url).port or 4222}
    ports |= {c.health_port for c in children if c.health_port}
    return {"TORPOR_WEBHOOKS_EXTRA_CONTROL_PORTS": ",".join(str(p) for p in sorted(ports))}


def operator_bus(nats_url: str, passwords: dict[str, str]) -> BusSettings:
    return BusSettings.model_validate(
        {"nats_url": nats_url, **{k.lower(): v for k, v in client_env(OPERATOR, passwords).items()}}
    )


def run_up(plan: Plan) -> int:
    """Blocks until Ctrl-C/SIGTERM. NATS starts first and stops last."""
    # The data dir holds keys, bus credentials and logs: its owner's only.
    os.chmod(plan.data_dir, 0o700)
    passwords = load_or_create(plan.data_dir / "nats")
    nats = EmbeddedNats(
        data_dir=plan.data_dir / "nats",
        host=plan.host,
        port=plan.nats_port,
        die_with_parent=True,
        passwords=passwords,
        avoid_ports=frozenset({plan.api_port, plan.proxy_port}),
    )
    nats.start()
    try:
        return asyncio.run(_supervise(plan, nats, passwords))
    finally:
        remove_state(plan.data_dir)
        # Sandboxes stop with the instance (no orphans); their records keep replicas=1, so the
        # next `torpor up` restarts them.
        with contextlib.suppress(Exception):
            asyncio.run(_stop_sandboxes(plan.data_dir))
        nats.stop()


async def _stop_sandboxes(data_dir: Path) -> None:
    """Every pod of the instance, then its mounts and its pod network (namespaces, links, rules,
    route)."""
    try:
        await procfs.stop_all(data_dir, grace=2.0)
        await asyncio.to_thread(unmount_stopped, data_dir)
    finally:
        await release_instance(data_dir)


async def _supervise(plan: Plan, nats: EmbeddedNats, passwords: dict[str, str]) -> int:
    public = {"api": plan.api_port, "proxy": plan.proxy_port}
    planned = {plan.api_port, plan.proxy_port, nats.port, nats.monitor_port}
    # The workers serve their probes on a socket held here for good (handed to each run); the
    # api and proxy answer on their public port, so theirs is only a port nobody listens on.
    workers = [spec for spec in catalog.SERVICES if spec.public_port is None]
    sockets = dict(
        zip(
            (spec.name for spec in workers),
            listeners(len(workers), plan.host, avoid=planned),
            strict=True,
        )
    )
    spare = iter(free_ports(len(catalog.SERVICES) - len(workers), plan.host, avoid=planned))
    children = [
        Child(
            spec=spec,
            health_port=(
                int(sockets[spec.name].getsockname()[1]) if spec.name in sockets else next(spare)
            ),
            health_socket=sockets.get(spec.name),
            port=public.get(spec.public_port) if spec.public_port else None,
            env=service_env(spec.name, passwords),
        )
        for spec in catalog.SERVICES
    ]
    try:
        return await _run(plan, nats, passwords, children)
    finally:
        for sock in sockets.values():
            sock.close()


async def _run(
    plan: Plan, nats: EmbeddedNats, passwords: dict[str, str], children: list[Child]
) -> int:
    stop = asyncio.Event()
    supervisor = Supervisor(
        children=children,
        env=child_env(plan, nats.url) | control_ports_env(plan, nats.url, children),
        log_dir=plan.data_dir / "logs",
        grace=plan.grace,
    )
    signals = 0

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        if signals > 1:
            supervisor.grace = 0  # a second Ctrl-C: do not wait for the services
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, on_signal)

    async with open_accounts(operator_bus(nats.url, passwords), local_runtime=True) as (keys, _):
        await ensure_admin_key(keys, plan.data_dir)
    if stop.is_set():
        return 0
    write_state(
        InstanceState(
            pid=os.getpid(),
            data_dir=plan.data_dir,
            nats_url=nats.url,
            api_url=plan.api_url,
            sandbox_url=plan.sandbox_url,
            api_port=plan.api_port,
            proxy_port=plan.proxy_port,
            started_at=datetime.now(UTC),
        )
    )
    view = StatusView(
        header=(
            f"NATS {nats.url}   API {plan.api_url}   sandboxes {plan.sandbox_url}\n"
            f"data {plan.data_dir}   logs {plan.data_dir / 'logs'}\n"
            'In another shell: eval "$(torpor env'
            + ("" if _default_data_dir(plan.data_dir) else f" --data-dir {plan.data_dir}")
            + ')"'
        ),
        nats_pid=nats.process.pid if nats.process else None,
    )
    supervisor.notify = view.event
    if not view.interactive:
        view.line(view.header.replace("\n", "   "))
        await supervisor.run(stop)
        view.line("stopped")
        return 0
    with Live(view.render(children), console=view.console, refresh_per_second=2) as live:
        refresher = asyncio.create_task(_refresh(live, view, children))
        try:
            await supervisor.run(stop)
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
        live.update(view.render(children))
    return 0


async def _refresh(live: Live, view: StatusView, children: list[Child]) -> None:
    while True:
        live.update(view.render(children))
        await asyncio.sleep(0.5)


def _default_data_dir(data_dir: Path) -> bool:
    from shared.settings import RuntimeSettings

    try:
        return RuntimeSettings().data_dir.expanduser().absolute() == data_dir
    except Exception:
        return False
