"""The server's contexts: by id, and the default one per language (made on first use; python's
and bash's at start)."""

from __future__ import annotations

import asyncio
import contextlib

from services.interpreter.contexts import Context, ContextError, GlobalEnv
from services.interpreter.languages import Language

MAX_CONTEXTS = 64  # each is a kernel process; a sandbox has a memory limit of its own


class Contexts:
    def __init__(self, global_env: GlobalEnv, home: str) -> None:
        self._global_env = global_env
        self.home = home
        self._by_id: dict[str, Context] = {}
        self._defaults: dict[str, str] = {}
        self._default_locks: dict[str, asyncio.Lock] = {}

    def all(self) -> list[Context]:
        return list(self._by_id.values())

    def get(self, context_id: str) -> Context | None:
        return self._by_id.get(context_id)

    async def create(self, language: Language, cwd: str) -> Context:
        if len(self._by_id) >= MAX_CONTEXTS:
            msg = f"too many contexts ({MAX_CONTEXTS}): remove one first"
            raise ContextError(msg)
        context = Context(language, cwd, self._global_env)
        try:
            await context.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await context.close()
            raise
        self._by_id[context.id] = context
        return context

    async def default(self, language: Language) -> Context:
        lock = self._default_locks.setdefault(language.name, asyncio.Lock())
        async with lock:
            found = self._by_id.get(self._defaults.get(language.name, ""))
            if found is not None:
                return found
            context = await self.create(language, self.home)
            self._defaults[language.name] = context.id
            return context

    async def remove(self, context_id: str) -> bool:
        context = self._by_id.pop(context_id, None)
        if context is None:
            return False
        for name, default_id in list(self._defaults.items()):
            if default_id == context_id:
                del self._defaults[name]
        await context.close()
        return True

    async def close(self) -> None:
        for context_id in list(self._by_id):
            await self.remove(context_id)
