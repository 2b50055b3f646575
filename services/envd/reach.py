"""The out-of-reach domain every sandbox process starts in, and the entry step that puts a
template's own command in it.

``python -m services.envd.reach -- CMD [ARG...]`` enters the domain, then execs ``CMD`` with the
same argv, environment and working directory (``execvp``, as bwrap itself would have run it):
the local runtime starts a template's own ``command`` through it, so sandbox code that runs
without the daemon is as far from PID 1 as the daemon's children are. Imports nothing heavy, and
nothing from ``shared``.
"""

from __future__ import annotations

import os
import sys


def enter_domain(who: str, *, undumpable: bool) -> None:
    """Put this process (and everything it starts) out of reach of the sandbox code in it,
    which runs as the same uid, or as a root without CAP_SYS_PTRACE: no ptrace, pidfd_getfd,
    process_vm_*, /proc/<pid>/fd, mem or environ of the pod's PID 1 (nor of this process when
    ``undumpable``). Call it before any sandbox code runs.

    - ``undumpable``: the process turns non-dumpable, so tracing it needs CAP_SYS_PTRACE. The
      processes it starts exec, and are dumpable again (gdb, strace work among them). The
      daemon asks for it; the entry step does not (it execs the template's command at once).
    - It enters a Landlock domain, which every process it starts inherits: a process in a domain
      may trace only processes in the same or a nested one, and PID 1 (bwrap's init, which bwrap
      makes dumpable again itself) is in none. The domain restricts nothing else: it handles only
      making block devices, which sandbox root (no CAP_MKNOD) cannot do anyway, and scopes
      nothing, so CRIU's parasite still reaches its abstract socket (a scoped domain broke dumps,
      docs/memory-pause.md). Landlock denies moving a file to another directory in any domain
      unless a rule grants "refer" there, so one rule grants it beneath / (without it every
      cross-directory rename failed with EXDEV: pip, git, editors). Without Landlock (Linux <
      5.13) this says so on stderr, naming ``who``."""
    import ctypes
    import struct

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_dumpable, pr_set_no_new_privs = 4, 38
    create_ruleset, add_rule, restrict_self = 444, 445, 446  # the same on x86_64 and arm64
    access_fs_make_block, access_fs_refer = 1 << 11, 1 << 13
    rule_path_beneath = 1
    if undumpable and libc.prctl(pr_set_dumpable, 0, 0, 0, 0) != 0:
        print(f"{who}: cannot make itself non-dumpable", file=sys.stderr)
    # handled_access_fs, handled_access_net, scoped (a kernel that knows fewer fields takes the
    # zeros of the rest)
    packed = struct.pack("QQQ", access_fs_make_block | access_fs_refer, 0, 0)
    attr = ctypes.create_string_buffer(packed, len(packed))
    ruleset = libc.syscall(create_ruleset, attr, len(packed), 0)
    root = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    beneath = ctypes.create_string_buffer(struct.pack("=Qi", access_fs_refer, root), 12)
    if (
        ruleset < 0
        or libc.syscall(add_rule, ruleset, rule_path_beneath, beneath, 0) != 0
        or libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0
        or libc.syscall(restrict_self, ruleset, 0) != 0
    ):
        err = os.strerror(ctypes.get_errno())
        print(f"{who}: no Landlock domain ({err}): PID 1 is traceable", file=sys.stderr)
    os.close(root)
    if ruleset >= 0:
        os.close(ruleset)


def main(argv: list[str]) -> int:
    """``-- CMD [ARG...]``: enter the domain, then become ``CMD``."""
    if len(argv) < 2 or argv[0] != "--":
        print("usage: python -m services.envd.reach -- CMD [ARG...]", file=sys.stderr)
        return 2
    command = argv[1:]
    enter_domain("torpor-reach", undumpable=False)
    try:
        os.execvp(command[0], command)  # noqa: S606 - the template's argv, as bwrap runs it
    except OSError as exc:
        # bwrap's own words for a command it cannot run, and its exit code (execvp failed).
        print(f"bwrap: execvp {command[0]}: {exc.strerror}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
