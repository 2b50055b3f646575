"""Setting another process's dumpable flag: ``prctl(PR_SET_DUMPABLE)`` run inside it by
ptrace (x86-64), as a debugger calls a function in its debuggee.

Why: a memory restore brings the pod's PID 1 back non-dumpable (:func:`.checkpoint.seal_init`),
with its mm in the host's user namespace, so nothing without ``CAP_SYS_PTRACE`` over the host
can trace it. CRIU's own dump of such a tree checks, from inside the pod's user namespace, that
it can open PID 1's namespaces, which that same rule refuses ("Can't open <pid>/ns/uts on
procfs: Permission denied"). So the next pause makes PID 1 dumpable for the dump only (the
tree is frozen by CRIU and gone after it; the images are sealed again) and back if the dump
fails. Only the host's root, which may trace anything, can do this.

The task is interrupted (``PTRACE_INTERRUPT``); its registers are saved; it executes one
``syscall`` instruction of its own text (the one it is blocked in, or one found in an executable
mapping) with ``orig_rax`` -1 so no interrupted-syscall restart applies to it; then its registers
are put back and it is detached: the interrupted syscall restarts as after any stop.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

from shared.errors import RuntimeFailure

_PTRACE_GETREGS = 12
_PTRACE_SETREGS = 13
_PTRACE_SINGLESTEP = 9
_PTRACE_DETACH = 17
_PTRACE_SEIZE = 0x4206
_PTRACE_INTERRUPT = 0x4207
_SYS_PRCTL = 157
_PR_SET_DUMPABLE = 4
_SYSCALL = b"\x0f\x05"
# struct user_regs_struct (x86-64): 27 unsigned longs, in this order.
_REGS = [
    "r15",
    "r14",
    "r13",
    "r12",
    "rbp",
    "rbx",
    "r11",
    "r10",
    "r9",
    "r8",
    "rax",
    "rcx",
    "rdx",
    "rsi",
    "rdi",
    "orig_rax",
    "rip",
    "cs",
    "eflags",
    "rsp",
    "ss",
    "fs_base",
    "gs_base",
    "ds",
    "es",
    "fs",
    "gs",
]


class _Regs(ctypes.Structure):
    _fields_ = [(name, ctypes.c_ulonglong) for name in _REGS]


class DumpableFailure(RuntimeFailure):
    pass


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    return libc


def set_dumpable(pid: int, value: int) -> None:
    """Run ``prctl(PR_SET_DUMPABLE, value)`` in process ``pid`` (single-threaded, stopped
    nowhere else). Raises :class:`DumpableFailure`."""
    if platform.machine() != "x86_64":
        msg = f"setting another process's dumpable flag is x86-64 only, not {platform.machine()}"
        raise DumpableFailure(msg)
    libc = _libc()

    def call(request: int, data: object = None) -> int:
        ctypes.set_errno(0)
        result = int(libc.ptrace(request, pid, None, data))
        if result == -1 and ctypes.get_errno():
            code = ctypes.get_errno()
            raise DumpableFailure(f"ptrace({request}) of {pid}: {os.strerror(code)}")
        return result

    call(_PTRACE_SEIZE)
    try:
        call(_PTRACE_INTERRUPT)
        _wait_stop(pid)
        saved = _Regs()
        call(_PTRACE_GETREGS, ctypes.byref(saved))
        try:
            regs = _Regs.from_buffer_copy(saved)
            regs.rip = _syscall_address(pid, saved.rip)
            regs.rax, regs.orig_rax = _SYS_PRCTL, 2**64 - 1
            regs.rdi, regs.rsi, regs.rdx, regs.r10, regs.r8 = _PR_SET_DUMPABLE, value, 0, 0, 0
            call(_PTRACE_SETREGS, ctypes.byref(regs))
            call(_PTRACE_SINGLESTEP)
            _wait_stop(pid)
            done = _Regs()
            call(_PTRACE_GETREGS, ctypes.byref(done))
        finally:
            call(_PTRACE_SETREGS, ctypes.byref(saved))
        result = struct.unpack("q", struct.pack("Q", done.rax))[0]
        if result != 0:
            msg = f"prctl(PR_SET_DUMPABLE, {value}) in {pid} failed: {os.strerror(-result)}"
            raise DumpableFailure(msg)
    finally:
        libc.ptrace(_PTRACE_DETACH, pid, None, None)


def _wait_stop(pid: int) -> None:
    while True:
        try:
            _, status = os.waitpid(pid, os.WUNTRACED | getattr(os, "__WALL", 0x40000000))
        except ChildProcessError as e:
            raise DumpableFailure(f"{pid} is gone") from e
        except InterruptedError:
            continue
        if os.WIFSTOPPED(status):
            return
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            msg = f"{pid} exited while traced"
            raise DumpableFailure(msg)


def _syscall_address(pid: int, rip: int) -> int:
    """A ``syscall`` instruction in ``pid``'s text: the one it is blocked in (just before
    ``rip``), else the first in an executable mapping."""
    try:
        with open(f"/proc/{pid}/mem", "rb", buffering=0) as mem:
            mem.seek(rip - 2)
            if mem.read(2) == _SYSCALL:
                return rip - 2
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    fields = line.split()
                    if "x" not in fields[1] or fields[-1].startswith("["):
                        continue
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    mem.seek(start)
                    found = mem.read(min(end - start, 1 << 20)).find(_SYSCALL)
                    if found >= 0:
                        return start + found
    except OSError as e:
        code = e.errno or errno.EIO
        raise DumpableFailure(f"cannot read the text of {pid}: {os.strerror(code)}") from e
    msg = f"no syscall instruction found in {pid}"
    raise DumpableFailure(msg)
