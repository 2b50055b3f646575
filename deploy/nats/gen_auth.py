"""Generate ``deploy/nats/auth.conf`` from the one permission model, ``shared/bus/permissions.py``
(the embedded broker of ``torpor up`` renders the very same file).

    .venv/bin/python deploy/nats/gen_auth.py > deploy/nats/auth.conf

Passwords are NOT in the file: each is an environment variable of the nats-server container
(``$NATS_<USER>_PASSWORD``), filled from the ``torpor-nats-auth`` Secret.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from shared.bus.permissions import User, render, users

__all__ = ["User", "main", "render", "users"]


def main() -> None:
    sys.stdout.write(render(users()))


if __name__ == "__main__":
    main()
