"""``torpor sandbox``: list / get / create / pause / resume / kill / logs against any torpor API.

Where to talk to: ``--url``/``--api-key``, else ``TORPOR_API_URL``/``TORPOR_API_KEY``, else
``E2B_API_URL``/``E2B_API_KEY``, else the embedded instance running in the data dir (its URL and
admin key, as ``torpor env`` prints them). The local admin key is only ever sent to the local
instance's URL. Every failure is one line on stderr and exit code 1.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console

from services.cli import sandbox_view as view
from services.cli.instance import read_admin_key, read_state
from shared.errors import ConfigError
from shared.ids import is_valid_sandbox_id
from shared.settings import RuntimeSettings, load

if TYPE_CHECKING:
    from services.cli.api_client import SandboxApi

app = typer.Typer(
    no_args_is_help=True,
    help="Manage sandboxes through a torpor API (default: the running 'torpor up').",
)

UrlOpt = Annotated[
    str | None,
    typer.Option("--url", help="API URL [env TORPOR_API_URL, E2B_API_URL; else torpor up's]"),
]
KeyOpt = Annotated[
    str | None,
    typer.Option(
        "--api-key", help="API key [env TORPOR_API_KEY, E2B_API_KEY; else torpor up's admin key]"
    ),
]
DataDirOpt = Annotated[
    Path | None,
    typer.Option("--data-dir", help="the embedded instance to fall back to", show_default=False),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="print JSON instead of tables")]
NameArg = Annotated[str, typer.Argument(help="the sandbox name (its id)")]


def _out() -> Console:
    return Console(highlight=False, soft_wrap=False)


def _err() -> Console:
    return Console(stderr=True, highlight=False)


def _env(*names: str) -> str | None:
    for name in names:
        if value := os.environ.get(name, "").strip():
            return value
    return None


def target(url: str | None, key: str | None, data_dir: Path | None) -> tuple[str, str]:
    """The API URL and key to use (see the module docstring for the order)."""
    url = url or _env("TORPOR_API_URL", "E2B_API_URL")
    key = key or _env("TORPOR_API_KEY", "E2B_API_KEY")
    if url is None or key is None:
        directory = (data_dir or load(RuntimeSettings).data_dir).expanduser().absolute()
        state = read_state(directory)
        if state is not None:
            if url is None:
                url = state.api_url
            if key is None and url.rstrip("/") == state.api_url.rstrip("/"):
                key = read_admin_key(directory)
    if url is None:
        msg = "no torpor API to talk to: set E2B_API_URL (or pass --url), or start 'torpor up'"
        raise ConfigError(msg)
    if key is None:
        msg = f"no API key for {url}: set E2B_API_KEY or pass --api-key"
        raise ConfigError(msg)
    return url, key


@contextlib.contextmanager
def _api(url: str | None, key: str | None, data_dir: Path | None) -> Iterator[SandboxApi]:
    """The client, with every API failure turned into one line and exit code 1."""
    from services.cli.api_client import ApiCallFailed, SandboxApi

    base, secret = target(url, key, data_dir)
    try:
        with SandboxApi(base, secret) as client:
            yield client
    except ApiCallFailed as e:
        _err().print(f"torpor: error: {e}", markup=False)
        raise typer.Exit(1) from None


def _check_name(name: str) -> str:
    if not is_valid_sandbox_id(name):
        _err().print(
            f"torpor: error: {name!r} is not a sandbox name (lowercase letters, digits, '-')",
            markup=False,
        )
        raise typer.Exit(1)
    return name


def _json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, default=str))


def _pairs(values: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in values:
        key, sep, value = item.partition("=")
        if not sep or not key:
            msg = f"{what} must look like KEY=VALUE, got {item!r}"
            raise ConfigError(msg)
        out[key] = value
    return out


# ---- commands ------------------------------------------------------------------------------


@app.command("list")
def list_(
    owner: Annotated[str | None, typer.Option(help="only this user's (admins)")] = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Your sandboxes (an admin sees everyone's)."""
    with _api(url, api_key, data_dir) as api:
        items = [s for s in api.sandboxes() if owner is None or s.owner == owner]
    if as_json:
        _json([s.model_dump(mode="json", by_alias=True) for s in items])
        return
    if not items:
        _err().print("no sandboxes")
        return
    _out().print(view.sandboxes_table(items))


@app.command()
def get(
    name: NameArg,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """State, deadline and the last snapshot (decoded) of one sandbox."""
    with _api(url, api_key, data_dir) as api:
        sandbox = api.get(_check_name(name))
    if as_json:
        _json(sandbox.model_dump(mode="json", by_alias=True))
        return
    out = _out()
    for n, table in enumerate(view.detail_tables(sandbox)):
        if n:
            out.print()
        out.print(table)


@app.command()
def create(  # noqa: PLR0917 - typer options
    name: Annotated[str | None, typer.Option(help="the sandbox name; generated if omitted")] = None,
    template: Annotated[str | None, typer.Option(help="template [default: sandbox-base]")] = None,
    timeout: Annotated[
        int | None, typer.Option(min=1, help="inactivity timeout in seconds [default: 300]")
    ] = None,
    auto_pause: Annotated[
        bool, typer.Option("--auto-pause", help="pause instead of kill on timeout")
    ] = False,
    auto_resume: Annotated[
        bool, typer.Option("--auto-resume", help="resume a paused sandbox on access")
    ] = False,
    metadata: Annotated[
        list[str] | None, typer.Option("--metadata", "-m", help="KEY=VALUE (repeatable)")
    ] = None,
    env: Annotated[
        list[str] | None, typer.Option("--env", "-e", help="KEY=VALUE (repeatable)")
    ] = None,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Create a sandbox and wait until it runs."""
    if name is not None:
        _check_name(name)
    meta, envs = _pairs(metadata or [], "--metadata"), _pairs(env or [], "--env")
    with _api(url, api_key, data_dir) as api, _err().status("Creating sandbox…"):
        sandbox = api.create(
            name=name,
            template=template,
            timeout=timeout,
            auto_pause=auto_pause,
            auto_resume=auto_resume,
            metadata=meta,
            envs=envs,
        )
    if as_json:
        _json(sandbox.model_dump(mode="json", by_alias=True))
        return
    _err().print(f"created {sandbox.name}", markup=False)
    typer.echo(sandbox.name)


@app.command()
def pause(
    name: NameArg,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Snapshot the sandbox's processes and scale it to zero; shows the snapshot."""
    with _api(url, api_key, data_dir) as api, _err().status(f"Pausing {name}…"):
        sandbox = api.pause(_check_name(name))
    if as_json:
        _json(sandbox.model_dump(mode="json", by_alias=True))
        return
    _out().print(f"{sandbox.name} is {view.state(sandbox.state)}")
    if (snap := view.snapshot_table(sandbox)) is not None:
        _out().print(snap)


@app.command()
def resume(
    name: NameArg,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Scale the sandbox back to one and replay its snapshot."""
    with _api(url, api_key, data_dir) as api, _err().status(f"Resuming {name}…"):
        sandbox = api.resume(_check_name(name))
    if as_json:
        _json(sandbox.model_dump(mode="json", by_alias=True))
        return
    _out().print(
        f"{sandbox.name} is {view.state(sandbox.state)}, deadline {view.until(sandbox.deadline)}"
    )


@app.command()
def kill(
    name: NameArg,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Kill the sandbox and delete its workload."""
    with _api(url, api_key, data_dir) as api, _err().status(f"Killing {name}…"):
        api.kill(_check_name(name))
    _out().print(f"{name} killed", markup=False)


@app.command()
def logs(  # noqa: PLR0917 - typer options
    name: NameArg,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="at most this many events")] = 200,
    as_json: JsonOpt = False,
    url: UrlOpt = None,
    api_key: KeyOpt = None,
    data_dir: DataDirOpt = None,
) -> None:
    """The sandbox's event history (created, paused, resumed, expired, killed…)."""
    with _api(url, api_key, data_dir) as api:
        events = api.events(_check_name(name), limit=limit)
    if as_json:
        _json([e.model_dump(mode="json", by_alias=True) for e in events])
        return
    _out().print(view.events_table(events))
