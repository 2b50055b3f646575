"""The pod's own ``/etc``: generated identity files (on the rootfs's ``/etc``, or, on test rigs
without a rootfs, plus the few host entries ``/usr`` needs).

On the sandbox rootfs (the local runtime's pods) only ``hostname``, ``hosts`` and
``resolv.conf`` are generated and bound read-only over the rootfs's own ``/etc``; accounts
(``root``, ``user`` 1000, ``sudo``) are the rootfs's. Without a rootfs (test rigs):

Never the host's ``/etc`` as a whole: it holds ``shadow``, ``gshadow``, ssh host keys, sudoers
and tool configs with tokens (``pip.conf``, ``npmrc``, ``gitconfig``). The pod gets a tmpfs
``/etc`` (read-only once filled) with its own ``passwd`` (root, and ``user`` uid 1000 with home
``/home/user``), ``group``, ``hosts``, ``hostname``, ``resolv.conf`` and ``nsswitch.conf``, and
read-only binds of an allowlist of host entries (certificates, the dynamic linker's cache,
alternatives, time zone, shell start-up files).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

HOST_ETC = Path("/etc")
# Host entries a pod may see (read-only): what programs under /usr need to work.
HOST_ENTRIES = (
    "alternatives",
    "bash.bashrc",
    "ca-certificates",
    "ca-certificates.conf",
    "debian_version",
    "fonts",
    "gai.conf",
    "host.conf",
    "inputrc",
    "ld.so.cache",
    "ld.so.conf",
    "ld.so.conf.d",
    "locale.alias",
    "localtime",
    "magic",
    "magic.mime",
    "mime.types",
    "networks",
    "os-release",
    "profile",
    "profile.d",
    "protocols",
    "services",
    "shells",
    "ssl/certs",
    "ssl/openssl.cnf",
    "terminfo",
    "timezone",
)
# Account lines ("x": no password here).
_ACCOUNTS = (
    "root:x:0:0:root:/root:/bin/bash\n"
    "user:x:1000:1000:user:/home/user:/bin/bash\n"
    "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
)
_GROUP = "root:x:0:\nuser:x:1000:\nnogroup:x:65534:\n"
_NSSWITCH = "passwd: files\ngroup: files\nshadow: files\nhosts: files dns\nnetworks: files\n"


def write_etc(folder: Path, *, hostname: str, address: str, accounts: bool = True) -> None:
    """Write the generated files into ``folder`` (a host folder the pod cannot see); without
    ``accounts`` only the network identity (the rootfs brings its own accounts)."""
    folder.mkdir(parents=True, exist_ok=True)
    hosts = f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost\n{address}\t{hostname}\n"
    files = {
        "hostname": f"{hostname}\n",
        "hosts": hosts,
        "resolv.conf": _resolv_conf(),
    }
    if accounts:
        files |= {"passwd": _ACCOUNTS, "group": _GROUP, "nsswitch.conf": _NSSWITCH}
    for name, text in files.items():
        (folder / name).write_text(text)


def _resolv_conf() -> str:
    """The host's resolver lines (no secrets there), or none."""
    try:
        text = (HOST_ETC / "resolv.conf").read_text()
    except OSError:
        return ""
    keep = ("nameserver", "search", "domain", "options")
    return "".join(line + "\n" for line in text.splitlines() if line.startswith(keep))


def bwrap_args(folder: Path, bind: Callable[..., list[str]]) -> list[str]:
    """bwrap options that put the generated files of ``folder`` over the rootfs's ``/etc``."""
    argv: list[str] = []
    for name in sorted(os.listdir(folder)):
        argv += bind(folder / name, f"/etc/{name}", read_only=True)
    return argv


def host_bwrap_args(folder: Path, bind: Callable[..., list[str]]) -> list[str]:
    """bwrap options that build the pod's ``/etc`` from ``folder`` and the allowlist;
    ``bind(source, dest, read_only=True)`` makes one bind's options."""
    argv = ["--tmpfs", "/etc"]
    for name in sorted(os.listdir(folder)):
        argv += bind(folder / name, f"/etc/{name}", read_only=True)
    entries = [*HOST_ENTRIES, *(p.name for p in sorted(HOST_ETC.glob("python3*")))]
    for entry in entries:
        host = HOST_ETC / entry
        if host.is_symlink():
            argv += ["--symlink", os.readlink(host), f"/etc/{entry}"]
        elif host.exists():
            argv += ["--ro-bind", str(host), f"/etc/{entry}"]
    return [*argv, "--remount-ro", "/etc"]
