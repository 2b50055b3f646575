"""``python -m services.cli``: the same as the ``torpor`` command (what ``torpor up`` spawns)."""

from services.cli.main import main

raise SystemExit(main())
