"""Native sandbox names: per user (``shared.ids.owned_sandbox_id``), resolved to records in one
place for the native API and the dashboard."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from services.api.deps import Caller, Wiring
from shared.domain.record import SandboxRecord
from shared.errors import NotFound, TorporError
from shared.ids import owned_sandbox_id


@contextmanager
def named(record: SandboxRecord, name: str) -> Iterator[None]:
    """Errors about the sandbox speak of it by the name the caller used, not its id."""
    try:
        yield
    except TorporError as e:
        if record.sandbox_id != name:
            e.args = tuple(
                a.replace(record.sandbox_id, name) if isinstance(a, str) else a for a in e.args
            )
        raise


async def resolve(w: Wiring, caller: Caller, name: str) -> SandboxRecord:
    """The caller's sandbox named ``name``, else the sandbox whose id is ``name`` (E2B-created
    sandboxes have no name; admins address anyone's by id). 404 either way otherwise."""
    try:
        return await w.lifecycle.get(owned_sandbox_id(caller.name, name), owner=caller.scope)
    except NotFound:
        pass
    try:
        return await w.lifecycle.get(name, owner=caller.scope)
    except NotFound:
        raise NotFound(f"sandbox {name} not found") from None
