"""Contexts: one Jupyter kernel each, started and supervised by this server (jupyter_client, no
Jupyter server in between).

A context runs one execution at a time (the next waits its turn). An execution is a stream of
outputs (``services.interpreter.outputs``, collected by ``services.interpreter.execution``); a
client that goes away interrupts it, and the context is handed to the next execution only once
the kernel is idle again (or after a grace period). A kernel that dies is started again at once
(its state is lost: the execution that was running gets an error saying so). Environment
variables: the sandbox's own (the daemon's ``/envs``) are set in every kernel before its first
execution; an execution's ``env_vars`` are set for it and restored afterwards (to the sandbox's
value, or unset)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from services.interpreter import outputs
from services.interpreter.execution import LATE_RESULT_GRACE, Execution, dispatch
from services.interpreter.languages import ENV_NAME, Language
from services.interpreter.outputs import Output

log = logging.getLogger("interpreter")

KEEPALIVE_SECONDS = 5.0
KERNEL_READY_TIMEOUT = 60.0
INTERRUPT_GRACE = 10.0
WATCH_INTERVAL = 0.5
# A request the kernel has not started after this long gets a kernel_info request behind it: after
# a memory restore a kernel's channel can miss the wakeup of a message that already arrived (seen
# 2 in 3 restores here: the python kernel idle in epoll with the execute request unread), and a
# new message on the same channels wakes it; a harmless request for a kernel that was just busy.
NUDGE_AFTER = 1.0
NUDGES = 30
IPYTHON_DIR = "/opt/torpor/interpreter/ipython"

GlobalEnv = Callable[[str | None], Awaitable[dict[str, str]]]
_BACKGROUND: set[asyncio.Task[None]] = set()  # held until done (the loop keeps weak references)


class ContextError(Exception):
    """A context that cannot do what was asked (the route answers 500 with the message)."""


class _Manager(AsyncKernelManager):
    """A kernel that dies with this server: killed -9, the server leaves no kernels behind
    (its supervisor starts a fresh server, which starts fresh kernels)."""

    def format_kernel_cmd(self, extra_arguments: list[str] | None = None) -> list[str]:
        cmd: list[str] = super().format_kernel_cmd(extra_arguments)
        setpriv = shutil.which("setpriv")
        return [setpriv, "--pdeathsig", "KILL", "--", *cmd] if setpriv else cmd


class Context:
    def __init__(self, language: Language, cwd: str, global_env: GlobalEnv) -> None:
        self.id = str(uuid.uuid4())
        self.language = language
        self.cwd = cwd
        self._global_env_source = global_env
        self._global_env: dict[str, str] | None = None
        self._start_env: dict[str, str] = {}  # what the kernel process started with
        self._lock = asyncio.Lock()
        self._executions: dict[str, Execution] = {}
        self._km: Any = None
        self._kc: Any = None
        self._readers: list[asyncio.Task[None]] = []
        self._watcher: asyncio.Task[None] | None = None
        self._closing = False
        # Clear while the kernel is being started again: an execution waits for the new kernel
        # instead of sending to the old one's channels, where nothing would ever answer it.
        self._settled = asyncio.Event()
        self._settled.set()
        # One restart at a time: a user's restart kills the kernel, and the watcher, seeing it
        # dead meanwhile, restarting it too ran two of jupyter_client's restarts at once (its
        # pending-state future is then resolved twice: "invalid state").
        self._restarting = asyncio.Lock()
        self.restarts = 0

    def describe(self) -> dict[str, str]:
        return {"id": self.id, "language": self.language.name, "cwd": self.cwd}

    # ---- kernel lifecycle --------------------------------------------------------------
    async def start(self) -> None:
        self._km = _Manager(kernel_name=self.language.kernel)
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self._start_env = env
        env["IPYTHONDIR"] = IPYTHON_DIR
        env.setdefault("MPLBACKEND", "module://matplotlib_inline.backend_inline")
        try:
            await self._km.start_kernel(cwd=_existing(self.cwd), env=env)
        except Exception as e:
            msg = f"cannot start a {self.language.name} kernel ({self.language.kernel}): {e}"
            raise ContextError(msg) from e
        await self._connect()
        await self._enter_cwd()
        self._watcher = asyncio.create_task(self._watch(), name=f"watch-{self.id}")

    async def _connect(self) -> None:
        self._kc = self._km.client()
        self._kc.start_channels()
        try:
            await self._kc.wait_for_ready(timeout=KERNEL_READY_TIMEOUT)
        except RuntimeError as e:
            msg = f"the {self.language.name} kernel did not become ready: {e}"
            raise ContextError(msg) from e
        self._readers = [
            asyncio.create_task(self._read(self._kc.get_iopub_msg), name=f"iopub-{self.id}"),
            asyncio.create_task(self._read(self._kc.get_shell_msg), name=f"shell-{self.id}"),
        ]

    async def _disconnect(self) -> None:
        for task in self._readers:
            task.cancel()
        for task in self._readers:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._readers = []
        if self._kc is not None:
            with contextlib.suppress(Exception):
                self._kc.stop_channels()

    async def _enter_cwd(self) -> None:
        snippet = self.language.chdir(self.cwd)
        if snippet and (problem := await self._silent(snippet)) is not None:
            msg = f"cannot enter {self.cwd!r}: {problem}"
            raise ContextError(msg)

    async def restart(self, reason: str = "Context was restarted") -> None:
        """A fresh kernel for this context (its state is gone); a running execution ends with
        a ``ContextRestarting`` error, the next one waits for the new kernel."""
        async with self._restarting:
            await self._restart(reason)

    async def _restart(self, reason: str) -> None:
        self._settled.clear()
        try:
            self._fail_all("ContextRestarting", reason)
            await self._disconnect()
            try:
                await self._km.restart_kernel(now=True)
            except Exception as e:
                msg = f"cannot restart the kernel: {e}"
                raise ContextError(msg) from e
            self.restarts += 1
            self._global_env = None
            await self._connect()
            await self._enter_cwd()
        finally:
            # One sent to the old channels while this ran would wait forever: it ends too.
            self._fail_all("ContextRestarting", reason)
            self._settled.set()

    async def close(self) -> None:
        self._closing = True
        if self._watcher is not None:
            self._watcher.cancel()
        self._fail_all("ContextRemoved", "Context was removed")
        await self._disconnect()
        if self._km is not None:
            with contextlib.suppress(Exception):
                await self._km.shutdown_kernel(now=True)

    async def _watch(self) -> None:
        """Supervision: a kernel that died (killed, out of memory) is started again."""
        while not self._closing:
            await asyncio.sleep(WATCH_INTERVAL)
            alive = await self._alive()
            if alive or self._closing or self._restarting.locked():
                continue  # a restart in progress has the kernel down on purpose
            async with self._restarting:
                if self._closing or await self._alive():  # restarted meanwhile
                    continue
                log.warning("kernel of context %s died; starting it again", self.id)
                try:
                    await self._restart("The kernel died (its state is lost); it was started again")
                except ContextError as e:
                    log.error("context %s: %s", self.id, e)

    async def _alive(self) -> bool:
        try:
            return bool(await self._km.is_alive())
        except Exception:
            return False

    # ---- messages -------------------------------------------------------------------------
    async def _read(self, receive: Callable[[], Awaitable[dict[str, Any]]]) -> None:
        while True:
            try:
                msg = await receive()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # a malformed or unsigned message: dropped
                log.warning("context %s: unreadable kernel message: %s", self.id, e)
                continue
            dispatch(self._executions, msg)

    def _fail_all(self, name: str, value: str) -> None:
        for execution in list(self._executions.values()):
            execution.put(outputs.error(name, value, ""))
            execution.end()

    def _send(self, code: str, *, silent: bool) -> tuple[str, Execution]:
        grace = LATE_RESULT_GRACE if self.language.late_outputs else 0.0
        execution = Execution(silent=silent, late_grace=grace)
        msg_id: str = self._kc.execute(
            code,
            silent=silent,
            store_history=not silent,
            allow_stdin=False,
            stop_on_error=not silent,
        )
        self._executions[msg_id] = execution
        task = asyncio.create_task(self._nudge(execution), name=f"nudge-{msg_id}")
        _BACKGROUND.add(task)
        task.add_done_callback(_BACKGROUND.discard)
        return msg_id, execution

    async def _nudge(self, execution: Execution) -> None:
        """A kernel_info request now and then until the kernel starts ``execution`` (see
        ``NUDGE_AFTER``); ends by itself."""
        for attempt in range(NUDGES):
            await asyncio.sleep(NUDGE_AFTER)
            if execution.started or execution.finished.is_set() or self._closing:
                return
            if self._settled.is_set():
                if attempt == 0:
                    log.info("context %s: kernel has not started a request; nudging it", self.id)
                with contextlib.suppress(Exception):
                    self._kc.kernel_info()

    async def _silent(self, code: str) -> str | None:
        """Run a snippet of the server's own; its error text, or None."""
        msg_id, execution = self._send(code, silent=True)
        problem = None
        try:
            while True:
                item = await asyncio.wait_for(execution.queue.get(), KERNEL_READY_TIMEOUT)
                if item["type"] == "end_of_execution":
                    return problem
                if item["type"] == "error":
                    problem = f"{item['name']}: {item['value']}"
        except TimeoutError:
            return "the kernel did not answer"
        finally:
            self._executions.pop(msg_id, None)

    # ---- executions -----------------------------------------------------------------------
    async def run(
        self, code: str, env: dict[str, str], access_token: str | None
    ) -> AsyncIterator[Output]:
        """The outputs of one execution, keepalives while it runs, ``end_of_execution`` last."""
        await self._lock.acquire()
        handed_off = False
        msg_id: str | None = None
        try:
            await self._settled.wait()
            await self._apply_global_env(access_token)
            if env:
                await self._silent(self.language.set_env(env))
            msg_id, execution = self._send(code, silent=False)
            while True:
                try:
                    item = await asyncio.wait_for(execution.queue.get(), KEEPALIVE_SECONDS)
                except TimeoutError:
                    # A write every few seconds: a client that went away is noticed (the
                    # server then cancels this stream) even while the kernel prints nothing.
                    yield outputs.KEEPALIVE
                    continue
                if item["type"] == "end_of_execution":
                    break
                yield item
            self._executions.pop(msg_id, None)
            msg_id = None
            if env:
                await self._silent(self._restore(env))
        finally:
            if msg_id is not None:  # the client left (or the stream broke) mid-execution
                handed_off = True
                task = asyncio.create_task(self._abandon(msg_id, env), name=f"abandon-{msg_id}")
                _BACKGROUND.add(task)
                task.add_done_callback(_BACKGROUND.discard)
            if not handed_off:
                self._lock.release()

    async def _abandon(self, msg_id: str, env: dict[str, str]) -> None:
        """Interrupt an execution nobody reads any more; the next one runs once the kernel is
        idle (or after the grace period), with the execution's env vars restored."""
        try:
            execution = self._executions.get(msg_id)
            if execution is not None and not execution.finished.is_set():
                log.info("context %s: client left mid-execution; interrupting", self.id)
                with contextlib.suppress(Exception):
                    await self._km.interrupt_kernel()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(execution.finished.wait(), INTERRUPT_GRACE)
            self._executions.pop(msg_id, None)
            if env:
                await self._silent(self._restore(env))
        except Exception as e:
            log.error("context %s: after an abandoned execution: %s", self.id, e)
        finally:
            self._lock.release()

    async def _apply_global_env(self, access_token: str | None) -> None:
        if self._global_env is not None:
            return
        try:
            found = await self._global_env_source(access_token)
        except Exception as e:
            log.warning("context %s: the sandbox's env vars are unavailable: %s", self.id, e)
            found = {}
        self._global_env = {k: v for k, v in found.items() if ENV_NAME.match(k) and "\0" not in v}
        if self._global_env:
            await self._silent(self.language.set_env(self._global_env))

    def _restore(self, env: dict[str, str]) -> str:
        """Back to the sandbox's value (its ``/envs``, else what the kernel started with)."""
        sandbox = {**self._start_env, **(self._global_env or {})}
        back = {k: sandbox[k] for k in env if k in sandbox}
        gone = [k for k in env if k not in sandbox]
        parts = (self.language.set_env(back), self.language.unset_env(gone))
        return "\n".join(part for part in parts if part)


def _existing(cwd: str) -> str:
    """The kernel process starts in ``cwd`` when it exists (the chdir snippet reports a missing
    one in the kernel's own words)."""
    return cwd if os.path.isdir(cwd) else "/"
