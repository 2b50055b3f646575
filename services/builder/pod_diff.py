"""What a build pod's filesystem gained in one step, as an OCI layer (run inside the pod).

The builder sends this file's text to the build pod's daemon as ``python3 -c <text> ...``, run
as root; standard library only, nothing of torpor is imported (the pod may have nothing else).

- ``snap ROOT STATE``: record every entry under ROOT (lstat: type+mode, owner, size, mtime and
  ctime in ns, inode) in STATE.
- ``diff ROOT STATE OUT``: walk again; write to OUT a tar of what is new or changed (ctime moves
  on any write, chmod, chown or rename) and an OCI whiteout (``.wh.<name>``) for each entry gone
  (one for a removed folder, none for what was inside it); then STATE becomes the new walk.

Never walked: the kernel's and the pod's own mounts (/proc, /sys, /dev, files bind-mounted by
the kubelet such as /etc/hosts, tmpfs and cgroup mounts) and the build's own folder. What this
writes is the tenant's to shape: the builder checks and repacks it (shared/oci/layers.py).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tarfile

SKIP = {"/proc", "/sys", "/dev", "/run/torpor-build", "/run/torpor"}
SKIP_FSTYPES = {
    "proc",
    "sysfs",
    "devpts",
    "devtmpfs",
    "mqueue",
    "cgroup",
    "cgroup2",
    "tmpfs",
    "securityfs",
    "debugfs",
    "tracefs",
    "bpf",
    "fusectl",
    "configfs",
    "pstore",
    "hugetlbfs",
}


def skipped(root: str) -> set[str]:
    out = {os.path.normpath(root + p) for p in SKIP} if root != "/" else set(SKIP)
    if root != "/":
        return out
    try:
        with open("/proc/self/mountinfo") as f:
            lines = f.read().splitlines()
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        sep = fields.index("-")
        point = fields[4].encode().decode("unicode_escape")
        fstype = fields[sep + 1]
        if point == "/":
            continue
        if fstype in SKIP_FSTYPES or not os.path.isdir(point) or os.path.islink(point):
            out.add(point)  # kernel filesystems and files the kubelet bind-mounts
    return out


def walk(root: str) -> dict[str, list[int]]:
    skip = skipped(root)
    entries: dict[str, list[int]] = {}
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            with os.scandir(folder) as it:
                children = list(it)
        except OSError:
            continue
        for entry in children:
            path = entry.path
            if path in skip:
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            if stat.S_ISSOCK(st.st_mode):
                continue  # a layer cannot hold a socket
            rel = os.path.relpath(path, root)
            entries[rel] = [
                st.st_mode,
                st.st_uid,
                st.st_gid,
                st.st_size,
                st.st_mtime_ns,
                st.st_ctime_ns,
                st.st_ino,
            ]
            if stat.S_ISDIR(st.st_mode):
                stack.append(path)
    return entries


def whiteout(rel: str) -> str:
    folder, _, base = rel.rpartition("/")
    return f"{folder}/.wh.{base}" if folder else f".wh.{base}"


def diff(root: str, before: dict[str, list[int]], out: str) -> dict[str, list[int]]:
    after = walk(root)
    gone = sorted(p for p in before if p not in after)
    gone_set = set(gone)
    changed = sorted(p for p, v in after.items() if before.get(p) != v)
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for rel in gone:
            parent = rel.rpartition("/")[0]
            if parent and parent in gone_set:
                continue  # the parent's whiteout covers it
            info = tarfile.TarInfo(whiteout(rel))
            info.mode = 0o644
            tar.addfile(info)
        for rel in changed:
            path = os.path.join(root, rel)
            old = before.get(rel)
            if old is not None and stat.S_IFMT(old[0]) != stat.S_IFMT(after[rel][0]):
                # a file turned into a folder (or back): delete the old one first
                info = tarfile.TarInfo(whiteout(rel))
                info.mode = 0o644
                tar.addfile(info)
            try:
                tar.add(path, arcname=rel, recursive=False)
            except OSError:
                continue  # gone meanwhile
    return after


def main(argv: list[str]) -> int:
    command, root, state = argv[0], argv[1], argv[2]
    os.makedirs(os.path.dirname(state), mode=0o700, exist_ok=True)
    if command == "snap":
        entries = walk(root)
    elif command == "diff":
        with open(state) as f:
            before = json.load(f)
        entries = diff(root, before, argv[3])
    else:
        print(f"unknown command {command!r}", file=sys.stderr)
        return 2
    tmp = state + ".tmp"
    with open(tmp, "w") as f:
        json.dump(entries, f)
    os.replace(tmp, state)
    print(len(entries))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
