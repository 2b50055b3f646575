"""The passwords of the embedded broker's users (``torpor up``), generated on first start.

One JSON file, ``<data dir>/nats/credentials.json`` (mode 0600, its folder 0700): ``{user:
password}`` for every user of ``shared.bus.permissions``. Kept across restarts, so an operator's
``torpor env`` stays valid; a user added to the model later gets a password on the next start.
The broker reads them from its environment (``$NATS_<USER>_PASSWORD``), each service gets only its
own (``NATS_USER``/``NATS_PASSWORD``), and no password is ever logged.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from shared.bus.permissions import User, users
from shared.errors import ConfigError

CREDENTIALS_FILE = "credentials.json"
OPERATOR = "admin"  # torpor keys, torpor env, provisioning
PLATFORM = "platform"  # other platform services


def new_password() -> str:
    # A letter first: nats-server parses an environment value that looks like a number as one.
    return "p" + secrets.token_hex(24)


def write_private(path: Path, text: str) -> None:
    """Created 0600 (never briefly world-readable), replaced atomically."""
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.chmod(tmp, 0o600)
    tmp.replace(path)


def load_or_create(folder: Path, model: list[User] | None = None) -> dict[str, str]:
    """Every user's password, creating the file (and missing entries) as needed."""
    path = folder / CREDENTIALS_FILE
    try:
        folder.mkdir(parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        existing = read(folder) if path.exists() else {}
        wanted = [u.name for u in (model if model is not None else users())]
        passwords = {name: existing.get(name) or new_password() for name in wanted}
        if passwords != existing:
            write_private(path, json.dumps(passwords, indent=2) + "\n")
        os.chmod(path, 0o600)
    except OSError as e:
        msg = f"cannot keep the bus credentials in {folder}: {e.strerror or e}"
        raise ConfigError(msg) from None
    return passwords


def read(folder: Path) -> dict[str, str]:
    path = folder / CREDENTIALS_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        msg = f"no bus credentials in {folder}: start 'torpor up' once"
        raise ConfigError(msg) from None
    except (OSError, ValueError) as e:
        msg = f"unreadable bus credentials {path}: {type(e).__name__}"
        raise ConfigError(msg) from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in data.items()
    ):
        msg = f"malformed bus credentials {path}"
        raise ConfigError(msg)
    return dict(data)


def server_env(passwords: Mapping[str, str], model: list[User] | None = None) -> dict[str, str]:
    """What nats-server needs in its environment to resolve ``auth.conf``."""
    return {u.password_env: passwords[u.name] for u in (model if model is not None else users())}


def client_env(user: str, passwords: Mapping[str, str]) -> dict[str, str]:
    """One user's settings for ``shared.settings.BusSettings`` (a service, the CLI)."""
    return {"NATS_USER": user, "NATS_PASSWORD": passwords[user]}
