"""What ``torpor up`` leaves in its data dir for ``torpor env`` and ``torpor keys``.

- ``torpor.json``: the running instance (supervisor pid, URLs, ports); removed on clean exit and
  recognised as stale when its pid is gone.
- ``admin-api-key``: the first user's API key (mode 0600), created on first start.
"""

from __future__ import annotations

import os
import shlex
from datetime import datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from shared.errors import ConfigError

STATE_FILE = "torpor.json"
ADMIN_KEY_FILE = "admin-api-key"
ADMIN_USER = "admin"


class InstanceState(BaseModel):
    model_config = ConfigDict(frozen=True)

    schema_version: int = 1
    pid: int
    data_dir: Path
    nats_url: str
    api_url: str
    sandbox_url: str
    api_port: int
    proxy_port: int
    started_at: datetime

    def is_alive(self) -> bool:
        return pid_alive(self.pid)


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie counts as gone (its parent has not reaped it yet).
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def ensure_writable(data_dir: Path) -> Path:
    try:
        data_dir.mkdir(parents=True, exist_ok=True)
        probe = data_dir / ".write-probe"
        probe.write_text("ok")
        probe.unlink()
    except OSError as e:
        msg = f"data dir {data_dir} is not writable: {e.strerror or e}"
        raise ConfigError(msg) from None
    return data_dir


def write_private(path: Path, text: str) -> None:
    """Write a file only its owner can read (created 0600, never briefly world-readable)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(path, 0o600)


def write_state(state: InstanceState) -> None:
    path = state.data_dir / STATE_FILE
    tmp = path.with_suffix(".tmp")
    write_private(tmp, state.model_dump_json(indent=2))
    tmp.replace(path)


def read_state(data_dir: Path) -> InstanceState | None:
    """The running instance in ``data_dir``, or ``None`` when there is none (or it is stale)."""
    path = data_dir / STATE_FILE
    try:
        state = InstanceState.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None
    return state if state.is_alive() else None


def remove_state(data_dir: Path) -> None:
    (data_dir / STATE_FILE).unlink(missing_ok=True)


def running_instance(data_dir: Path) -> InstanceState:
    state = read_state(data_dir)
    if state is None:
        msg = f"no running torpor instance in {data_dir}: start one with 'torpor up'"
        raise ConfigError(msg)
    return state


def read_admin_key(data_dir: Path) -> str | None:
    try:
        return (data_dir / ADMIN_KEY_FILE).read_text().strip() or None
    except OSError:
        return None


def env_lines(
    state: InstanceState, api_key: str | None, bus: dict[str, str] | None = None
) -> list[str]:
    """``bus``: ``NATS_USER``/``NATS_PASSWORD`` of the bus user to hand out."""
    values = {"NATS_URL": state.nats_url, **(bus or {})}
    values |= {"E2B_API_URL": state.api_url, "E2B_SANDBOX_URL": state.sandbox_url}
    if api_key:
        values["E2B_API_KEY"] = api_key
    return [f"export {k}={shlex.quote(v)}" for k, v in values.items()]
