"""The ``torpor`` command: ``up``, ``run``, ``env``, ``keys`` and ``envd``.

Bad configuration is reported as one line on stderr with exit code 2, never a traceback.
"""

from __future__ import annotations

import asyncio
import importlib
import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Annotated

import click
import structlog
import typer

from services.cli import catalog
from services.cli.instance import (
    ensure_writable,
    env_lines,
    read_admin_key,
    read_state,
    running_instance,
)
from services.cli.settings import UpSettings
from shared.errors import ConfigError, NotFound
from shared.settings import BusSettings, RuntimeSettings, load

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="torpor: a self-hosted, E2B-compatible sandbox control plane with Pause & Resume.",
)
keys_app = typer.Typer(no_args_is_help=True, help="Manage users' API keys (stored hashed).")
app.add_typer(keys_app, name="keys")
app.add_typer(importlib.import_module("services.cli.sandboxes").app, name="sandbox")

DataDirOpt = Annotated[
    Path | None,
    typer.Option(
        "--data-dir",
        help="State of the embedded instance [env TORPOR_DATA_DIR; default ~/.local/share/torpor]",
        show_default=False,
    ),
]


def _data_dir(flag: Path | None) -> Path:
    return (flag or load(RuntimeSettings).data_dir).expanduser().absolute()


def _check_port_free(what: str, port: int, host: str = "127.0.0.1") -> None:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            msg = f"{what} port {host}:{port} is already in use (choose another with --{what}-port)"
            raise ConfigError(msg) from None


def _check_runtime(runtime: RuntimeSettings, data_dir: Path) -> None:
    if runtime.runtime == "local" and shutil.which("bwrap") is None:
        msg = (
            "the local runtime needs bubblewrap (bwrap), which is not installed: "
            "run 'sudo apt-get install -y bubblewrap' (or set TORPOR_RUNTIME=kubernetes)"
        )
        raise ConfigError(msg)
    if runtime.runtime == "local":
        from shared.runtime.factory import LocalRuntimeSettings
        from shared.runtime.local.network import PodNetwork

        # Claim the pod range now: a clash is one line here, not services failing to start.
        pod_cidr = load(LocalRuntimeSettings).pod_cidr
        asyncio.run(PodNetwork(data_dir, pod_cidr=pod_cidr).open())


@app.command()
def up(
    data_dir: DataDirOpt = None,
    api_port: Annotated[
        int | None, typer.Option(help="E2B_API_URL port [env TORPOR_API_PORT; default 3000]")
    ] = None,
    proxy_port: Annotated[
        int | None,
        typer.Option(help="E2B_SANDBOX_URL port [env TORPOR_PROXY_PORT; default 3001]"),
    ] = None,
    nats_port: Annotated[
        int | None,
        typer.Option(help="embedded NATS port, 0 = any [env TORPOR_NATS_PORT; default 4222]"),
    ] = None,
) -> None:
    """Start embedded NATS and every service, supervised, until Ctrl-C."""
    from services.cli.upping import Plan, run_up

    settings = load(UpSettings)
    runtime = load(RuntimeSettings)
    plan = Plan(
        data_dir=ensure_writable(_data_dir(data_dir)),
        api_port=api_port if api_port is not None else settings.api_port,
        proxy_port=proxy_port if proxy_port is not None else settings.proxy_port,
        nats_port=nats_port if nats_port is not None else settings.nats_port,
        grace=settings.stop_grace,
    )
    if (running := read_state(plan.data_dir)) is not None:
        msg = f"torpor is already running in {plan.data_dir} (pid {running.pid}); see 'torpor env'"
        raise ConfigError(msg)
    if len({plan.api_port, plan.proxy_port, plan.nats_port}) < 3:
        msg = "the api, proxy and NATS ports must differ"
        raise ConfigError(msg)
    _check_port_free("api", plan.api_port)
    _check_port_free("proxy", plan.proxy_port)
    if plan.nats_port:
        _check_port_free("nats", plan.nats_port)
    _check_runtime(runtime, plan.data_dir)
    raise typer.Exit(run_up(plan))


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def run(
    ctx: typer.Context,
    service: Annotated[str, typer.Argument(help=f"one of: {', '.join(catalog.NAMES)}")],
) -> None:
    """Run one service in the foreground (what a Kubernetes Deployment runs)."""
    raise typer.Exit(run_service(service, list(ctx.args)))


def run_service(name: str, argv: list[str]) -> int:
    if name not in catalog.NAMES:
        msg = f"unknown service {name!r}; choose one of: {', '.join(catalog.NAMES)}"
        raise ConfigError(msg)
    module = importlib.import_module(f"services.{name}.main")
    return int(module.main(argv) or 0)


@app.command()
def env(
    data_dir: DataDirOpt = None,
    nats_user: Annotated[
        str,
        typer.Option(
            "--nats-user",
            help="bus credentials to export: 'admin' (the operator: torpor keys, the nats CLI) or "
            "'platform' (other platform services: commands and events only; no API key then)",
        ),
    ] = "admin",
) -> None:
    """Print export lines for the running embedded instance: eval "$(torpor env)"."""
    from shared.bus.credentials import OPERATOR, PLATFORM, client_env, read

    if nats_user not in {OPERATOR, PLATFORM}:
        msg = f"--nats-user must be {OPERATOR!r} or {PLATFORM!r}, got {nats_user!r}"
        raise ConfigError(msg)
    directory = _data_dir(data_dir)
    state = running_instance(directory)
    bus = client_env(nats_user, read(directory / "nats"))
    api_key = read_admin_key(directory) if nats_user == OPERATOR else None
    for line in env_lines(state, api_key, bus):
        typer.echo(line)


def _bus_for_keys(nats_url: str | None, data_dir: Path | None) -> BusSettings:
    """``--nats-url`` (with ``NATS_USER``/``NATS_PASSWORD``/``NATS_CREDS``), else ``NATS_URL``,
    else the running embedded instance as its operator."""
    if nats_url:
        return load(BusSettings, nats_url=nats_url)
    if os.environ.get("NATS_URL") or os.environ.get("TORPOR_NATS_URL"):
        return load(BusSettings)
    directory = _data_dir(data_dir)
    state = read_state(directory)
    if state is None:
        msg = "no NATS to talk to: set NATS_URL, pass --nats-url, or start 'torpor up'"
        raise ConfigError(msg)
    from services.cli.upping import operator_bus
    from shared.bus.credentials import read

    return operator_bus(state.nats_url, read(directory / "nats"))


NatsUrlOpt = Annotated[
    str | None, typer.Option("--nats-url", help="default: NATS_URL, else the running instance")
]


@keys_app.command("create")
def keys_create(
    user: str,
    admin: Annotated[bool, typer.Option("--admin", help="grant the admin role")] = False,
    nats_url: NatsUrlOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Issue a key for USER (created if missing). The secret is printed once, never stored."""
    from services.cli.accounts import open_accounts
    from shared.auth.models import check_user_name

    try:
        check_user_name(user)
    except ValueError as e:
        raise ConfigError(str(e)) from None

    async def go() -> tuple[str, str]:
        async with open_accounts(_bus_for_keys(nats_url, data_dir)) as (keys, _):
            return await keys.create(user, admin=admin)

    key_id, secret = asyncio.run(go())
    typer.echo(f"key id:  {key_id}", err=True)
    typer.echo(f"user:    {user}{' (admin)' if admin else ''}", err=True)
    typer.echo("secret (shown once, store it now):", err=True)
    typer.echo(secret)


@keys_app.command("list")
def keys_list(nats_url: NatsUrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """List API keys (ids and owners; never secrets)."""
    from services.cli.accounts import open_accounts

    async def go() -> list[tuple[str, str, bool, str, str]]:
        async with open_accounts(_bus_for_keys(nats_url, data_dir)) as (keys, users):
            admins = {u.name for u in await users.list() if u.admin}
            return [
                (
                    k.key_id,
                    k.user,
                    k.user in admins,
                    k.created_at.strftime("%Y-%m-%dT%H:%M:%SZ"),
                    "revoked" if k.revoked_at else "active",
                )
                for k in await keys.list()
            ]

    rows = asyncio.run(go())
    typer.echo(f"{'KEY ID':<18} {'USER':<24} {'CREATED':<21} STATUS")
    for key_id, user, is_admin, created, status in rows:
        who = f"{user} (admin)" if is_admin else user
        typer.echo(f"{key_id:<18} {who:<24} {created:<21} {status}")


@keys_app.command("revoke")
def keys_revoke(key_id: str, nats_url: NatsUrlOpt = None, data_dir: DataDirOpt = None) -> None:
    """Revoke a key by its id; requests with it are refused from now on."""
    from services.cli.accounts import open_accounts

    async def go() -> None:
        async with open_accounts(_bus_for_keys(nats_url, data_dir)) as (keys, _):
            await keys.revoke(key_id)

    try:
        asyncio.run(go())
    except NotFound as e:
        typer.echo(f"torpor: error: {e}", err=True)
        raise typer.Exit(1) from None
    typer.echo(f"revoked {key_id}")


QuotaOpt = Annotated[int | None, typer.Option(min=0, max=1_000_000)]
RateOpt = Annotated[float | None, typer.Option(min=0, max=1_000_000)]


@keys_app.command("quota")
def keys_quota(  # noqa: PLR0917 - one option per limit
    user: str,
    max_sandboxes: QuotaOpt = None,
    max_running: QuotaOpt = None,
    creates_per_minute: RateOpt = None,
    create_burst: QuotaOpt = None,
    resumes_per_minute: RateOpt = None,
    resume_burst: QuotaOpt = None,
    clear: Annotated[bool, typer.Option("--clear", help="back to the defaults")] = False,
    nats_url: NatsUrlOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Show USER's quota override, or set some of its limits (0 = unlimited). Limits not given
    keep their value; --clear removes the override (the api's TORPOR_QUOTA_* apply)."""
    from services.cli.accounts import open_accounts
    from shared.auth.models import check_user_name
    from shared.models.quota import QuotaOverride

    try:
        check_user_name(user)
        given = {
            k: v
            for k, v in {
                "max_sandboxes": max_sandboxes,
                "max_running": max_running,
                "creates_per_minute": creates_per_minute,
                "create_burst": create_burst,
                "resumes_per_minute": resumes_per_minute,
                "resume_burst": resume_burst,
            }.items()
            if v is not None
        }
        if clear and given:
            raise ValueError("--clear takes no limits")
    except ValueError as e:
        raise ConfigError(str(e)) from None

    async def go() -> QuotaOverride | None:
        async with open_accounts(_bus_for_keys(nats_url, data_dir)) as (_, users):
            found = await users.get(user)
            if found is None:
                raise NotFound(f"no user {user}")
            if clear:
                return (await users.set_quota(user, None)).quota
            if not given:
                return found.quota
            current = found.quota.model_dump() if found.quota else {}
            merged = QuotaOverride.model_validate({**current, **given})
            return (await users.set_quota(user, merged)).quota

    try:
        override = asyncio.run(go())
    except NotFound as e:
        typer.echo(f"torpor: error: {e}", err=True)
        raise typer.Exit(1) from None
    values = override.model_dump() if override else {}
    for name in QuotaOverride.model_fields:
        shown = values.get(name)
        typer.echo(f"{name:<20} {'default' if shown is None else shown}")


def _envd(argv: list[str]) -> int:
    try:
        module = importlib.import_module("services.envd.__main__")
    except ModuleNotFoundError:
        msg = "the in-sandbox daemon (services.envd) is not installed in this build"
        raise ConfigError(msg) from None
    return int(module.main(argv) or 0)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else list(argv)
    # Log lines (e.g. an open-bus warning) go to stderr: stdout carries secrets and exports that
    # callers capture. `torpor run` configures its service's logging itself.
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=sys.stderr))
    try:
        if args[:1] == ["envd"]:
            return _envd(args[1:])
        result = app(args=args, prog_name="torpor", standalone_mode=False)
        return result if isinstance(result, int) else 0
    except ConfigError as e:
        print(f"torpor: error: {e}", file=sys.stderr)
        return 2
    except click.UsageError as e:
        e.show()
        return 2
    except click.ClickException as e:
        e.show()
        return e.exit_code
    except (click.Abort, KeyboardInterrupt):
        return 130
