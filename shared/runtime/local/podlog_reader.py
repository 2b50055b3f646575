"""The host-side reader of a pod's output (:mod:`.podlog`), run as a script: a pipe on stdin,
``pod.log`` + ``pod.log.1`` in the pod's folder, at most ``cap`` bytes between them. Imports
nothing but ``os`` and ``sys`` (it starts with every pod)."""

from __future__ import annotations

import os
import sys

LOG = "pod.log"
OLDER = LOG + ".1"
MIN_CAP = 64 * 2**10
_CHUNK = 2**16


def _open_log(pod_dir: str) -> int:
    flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(os.path.join(pod_dir, LOG), flags, 0o600)  # owner-only: may hold secrets


def run_reader(pod_dir: str, cap: int, source: int = 0) -> None:
    """Copy ``source`` into ``pod_dir``'s log until EOF, keeping at most ``cap`` bytes."""
    half = max(MIN_CAP, cap) // 2
    out: int | None = None
    written = 0
    while True:
        try:
            chunk = os.read(source, _CHUNK)
        except InterruptedError:
            continue
        if not chunk:
            return
        try:
            if out is None:
                out = _open_log(pod_dir)
                written = os.fstat(out).st_size
            while chunk:
                room = half - written
                if room <= 0:
                    os.close(out)
                    out = None
                    os.replace(os.path.join(pod_dir, LOG), os.path.join(pod_dir, OLDER))
                    out = _open_log(pod_dir)
                    written = 0
                    room = half
                n = os.write(out, chunk[:room])
                written += n
                chunk = chunk[n:]
        except OSError:  # the folder went, or the disk is full: drop, keep reading
            if out is not None:
                try:  # noqa: SIM105 - contextlib is an import the reader does without
                    os.close(out)
                except OSError:
                    pass
            out = None


if __name__ == "__main__":
    run_reader(sys.argv[1], int(sys.argv[2]))
