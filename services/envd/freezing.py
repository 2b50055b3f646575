"""Stopping the sandbox's processes (SIGSTOP) while its files are exported, and continuing them
(SIGCONT) afterwards: an export of a moving tree is torn, and whatever a process writes after
the export is lost when the pod stops (``services.envd.archive``, ``GET /kept-files?hold=``).

Which processes:

- the daemon in a PID namespace below the host's (every pod, a container or bubblewrap): every
  process of the namespace except the daemon and its ancestors (PID 1 may be an init that
  started it), so one that left the daemon's tree (a double fork) is stopped too;
- the daemon in the host's namespace (tests and benchmarks run it bare): its descendants only.
  Nothing outside the sandbox is ever stopped.

A process already stopped (``T``/``t``: the user's ^Z, a debugger) is left alone and so never
continued by a thaw; exactly the processes this freezer stopped are continued, each checked by
its start time first (a pid may have been reused). Passes repeat until one stops nothing new (a
fork during a pass shows up in the next); one that never settles thaws and refuses.
After the passes it waits briefly for each stopped process to show ``T``: a process inside a
system call (a write in flight) finishes it first. A ``vfork`` parent whose child was stopped
before its exec never does until the thaw; it runs no user code meanwhile, so it counts as
stopped. One still not stopped after the wait has the SIGSTOP pending, so it runs no user code
again before it is continued. Reading ``/proc`` is only sound when it is the daemon's own PID
namespace's: otherwise the freezer refuses.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

MAX_PASSES = 50
SETTLE_SECONDS = 2.0
_PF_KTHREAD = 0x00200000  # a kernel thread: never a sandbox's
_PF_FORKNOEXEC = 0x00000040  # forked, not yet exec'd
_INIT_PID_NS_INODE = 0xEFFFFFFC  # the host's PID namespace (the kernel's PROC_PID_INIT_INO)


class FreezeFailed(Exception):
    """The sandbox could not be stopped consistently; nothing stays stopped by this attempt."""


@dataclass(frozen=True)
class Stat:
    pid: int
    ppid: int
    state: str
    flags: int
    start: int  # clock ticks after boot: with the pid, one process's identity


def read_stat(pid: int, proc: str = "/proc") -> Stat | None:
    try:
        with open(f"{proc}/{pid}/stat", "rb") as fh:
            raw = fh.read()
    except OSError:
        return None  # gone
    # The name (field 2) may hold spaces and parentheses: the fields follow its last ")".
    rest = raw[raw.rfind(b")") + 2 :].split()
    try:
        return Stat(pid, int(rest[1]), rest[0].decode(), int(rest[6]), int(rest[19]))
    except (IndexError, ValueError):
        return None


def _all(proc: str) -> Iterator[Stat]:
    for name in os.listdir(proc):
        if name.isdigit():
            st = read_stat(int(name), proc)
            if st is not None:
                yield st


def in_child_namespace(proc: str = "/proc") -> bool:
    """Whether the daemon's PID namespace is below the host's (a pod's). Not ``NSpid:``'s
    length: a namespace's own ``/proc`` (a pod's) lists only its own pid there. The host's
    namespace has a fixed inode, and only its ``/proc`` shows kernel threads: either says
    host, so a mistake can only ever freeze less."""
    try:
        if os.stat(f"{proc}/self/ns/pid").st_ino == _INIT_PID_NS_INODE:
            return False
    except OSError:
        return False
    return not any(st.flags & _PF_KTHREAD for st in _all(proc))


@dataclass
class Freezer:
    proc: str = "/proc"
    max_passes: int = MAX_PASSES
    settle_seconds: float = SETTLE_SECONDS
    # pid -> start time of every process this freezer stopped, in the order it stopped them
    stopped: dict[int, int] = field(default_factory=dict)

    @property
    def frozen(self) -> bool:
        return bool(self.stopped)

    def freeze(self) -> int:
        """Stop the sandbox's processes; how many are stopped by this freezer now (a repeat
        while frozen adds what appeared since). ``FreezeFailed``: everything it had stopped is
        continued again."""
        try:
            self._check_proc()
            whole_namespace = in_child_namespace(self.proc)
            for _ in range(self.max_passes):
                if not self._pass(whole_namespace=whole_namespace):
                    break
            else:
                msg = f"the sandbox's processes kept forking through {self.max_passes} passes"
                raise FreezeFailed(msg)
            self._settle()
        except FreezeFailed:
            self.thaw()
            raise
        except OSError as e:  # /proc or a pidfd failed us (EMFILE, ...): no half-frozen sandbox
            self.thaw()
            raise FreezeFailed(f"the sandbox's processes could not be stopped: {e}") from None
        return len(self.stopped)

    def thaw(self) -> int:
        """Continue exactly the processes this freezer stopped (the last stopped first); how
        many were continued."""
        continued = 0
        for pid, start in reversed(list(self.stopped.items())):
            if _signal_same(pid, start, signal.SIGCONT, self.proc):
                continued += 1
        self.stopped.clear()
        return continued

    def kill(self) -> int:
        """SIGKILL exactly the processes this freezer stopped: the daemon is going away with
        its pod, and a held process must never run (and write) again; how many were killed."""
        stopped = list(self.stopped.items())  # a freeze may be adding to it meanwhile
        killed = sum(_signal_same(pid, start, signal.SIGKILL, self.proc) for pid, start in stopped)
        self.stopped.clear()
        return killed

    def _check_proc(self) -> None:
        try:
            seen = int(os.readlink(f"{self.proc}/self"))
        except (OSError, ValueError):
            seen = -1
        if seen != os.getpid():
            # A /proc of another PID namespace: its pids are not the ones os.kill reaches.
            msg = "the daemon's /proc is not its own PID namespace's: nothing can be frozen"
            raise FreezeFailed(msg)

    def _candidates(self, *, whole_namespace: bool) -> list[Stat]:
        table = {st.pid: st for st in _all(self.proc)}
        me = os.getpid()
        if whole_namespace:
            spared = {me}
            parent = table[me].ppid if me in table else 0
            while parent in table and parent not in spared:
                spared.add(parent)
                parent = table[parent].ppid
            found = [st for pid, st in table.items() if pid not in spared]
        else:
            children: dict[int, list[int]] = {}
            for st in table.values():
                children.setdefault(st.ppid, []).append(st.pid)
            found, todo = [], list(children.get(me, []))
            while todo:
                pid = todo.pop()
                found.append(table[pid])
                todo += children.get(pid, [])
        return sorted(
            (st for st in found if not st.flags & _PF_KTHREAD), key=lambda st: (st.ppid, st.pid)
        )

    def _pass(self, *, whole_namespace: bool) -> bool:
        """One pass; whether it stopped anything new."""
        new = False
        for st in self._candidates(whole_namespace=whole_namespace):
            if st.pid in self.stopped or st.state in ("T", "t", "Z", "X", "x"):
                continue  # ours already, stopped by someone else, or dead
            try:
                if _signal_same(st.pid, st.start, signal.SIGSTOP, self.proc, running=True):
                    self.stopped[st.pid] = st.start
                    new = True
            except PermissionError:
                msg = f"process {st.pid} cannot be stopped by the daemon (permission denied)"
                raise FreezeFailed(msg) from None
        return new

    def _settle(self) -> None:
        deadline = time.monotonic() + self.settle_seconds
        waiting = dict(self.stopped)
        pause = 0.001
        while waiting and time.monotonic() < deadline:
            held = {pid: read_stat(pid, self.proc) for pid in self.stopped}
            # A vfork parent waits (D) for its child to exec; that child, stopped before it
            # did, keeps it there until the thaw. It runs no user code meanwhile: settled.
            vforking = {
                st.ppid
                for st in held.values()
                if st is not None and st.state in ("T", "t") and st.flags & _PF_FORKNOEXEC
            }
            for pid, start in list(waiting.items()):
                st = held.get(pid)
                if (
                    st is None
                    or st.start != start
                    or st.state in ("T", "t", "Z", "X", "x")
                    or (st.state == "D" and pid in vforking)
                ):
                    del waiting[pid]
            if waiting:
                time.sleep(pause)
                pause = min(pause * 2, 0.01)


def _signal_same(pid: int, start: int, sig: int, proc: str, *, running: bool = False) -> bool:
    """``sig`` to ``pid`` if it is still the process that started at ``start`` (and, with
    ``running``, not stopped meanwhile); whether it was sent. Through a pidfd, so the check and
    the signal are about the same process."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return False
    except OSError as e:
        if e.errno not in (errno.ENOSYS, errno.EINVAL):
            raise
        fd = -1  # no pidfds (Linux < 5.3): the start time check alone
    try:
        st = read_stat(pid, proc)
        if st is None or st.start != start:
            return False
        if running and st.state in ("T", "t", "Z", "X", "x"):
            return False
        with contextlib.suppress(ProcessLookupError):
            if fd >= 0:
                signal.pidfd_send_signal(fd, sig)
            else:
                os.kill(pid, sig)
            return True
        return False
    finally:
        if fd >= 0:
            os.close(fd)
