#!/usr/bin/env bash
# Installs CRIU 4.2.x for the local runtime's memory-keeping pause: Debian 12's CRIU 3.17 fails
# `criu check` on current kernels (vdso) and trixie's 4.1 cannot dump a TCP socket on 6.16+
# (SO_PASSCRED on INET sockets), so CRIU comes from Debian sid, unpacked by debootstrap
# (--variant=minbase --include=criu) into a private root; the host is untouched. sid's binary
# needs a newer glibc than the host's, so the wrapper `bin/criu` runs it through the root's own
# loader and libraries (no chroot: CRIU must see the host's /proc and mounts).
#
# Cached in ${TORPOR_CRIU_CACHE:-~/.cache/torpor/criu}/<key> (<key> covers this script), built
# into <key>.partial and renamed; concurrent builds wait on a lock; `current` names the newest.
# The build fails unless `criu --version` is 4.2 or newer and `criu check` passes on this kernel.
# Prints the wrapper's path on stdout (last line); progress goes to stderr, the debootstrap log
# to <key>.log. Needs root and deb.debian.org. A host without debootstrap gets one line, exit 2.
set -euo pipefail
CACHE=${TORPOR_CRIU_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/torpor/criu}
MIRROR=${TORPOR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=sid
MIN_MAJOR=4
MIN_MINOR=2

KEY=$(sha256sum "$0" | cut -c1-16)
OUT="$CACHE/$KEY"
WRAPPER="$OUT/bin/criu"

# major.minor of `criu --version` ("Version: 4.2.1") at least MIN_MAJOR.MIN_MINOR, and
# `criu check` says "Looks good."
verify() {
  local v major minor
  v=$("$1" --version 2>/dev/null | sed -n 's/^Version: *\([0-9][0-9]*\)\.\([0-9][0-9]*\).*/\1 \2/p')
  read -r major minor <<<"$v" || true
  if [[ -z ${major:-} ]] || (( major < MIN_MAJOR || (major == MIN_MAJOR && minor < MIN_MINOR) )); then
    echo "build-criu: $1 --version gave '${v:-nothing}', need >= $MIN_MAJOR.$MIN_MINOR" >&2
    return 1
  fi
  if ! "$1" check >"$CACHE/$KEY.check" 2>&1; then
    echo "build-criu: '$1 check' failed on kernel $(uname -r):" >&2
    tail -n 5 "$CACHE/$KEY.check" >&2
    return 1
  fi
}

done_() {
  ln -sfn "$KEY" "$CACHE/.current.new" && mv -T "$CACHE/.current.new" "$CACHE/current"
  echo "$WRAPPER"
  exit 0
}
# A cached build is checked again: the kernel may have changed since it was made.
if [[ -f "$OUT/.torpor-criu" ]]; then verify "$WRAPPER"; done_; fi

if ! command -v debootstrap >/dev/null 2>&1; then
  echo "build-criu: debootstrap is not installed (apt-get install -y debootstrap); without CRIU a pause keeps files only" >&2
  exit 2
fi
if [[ $(id -u) != 0 ]]; then
  echo "build-criu: must run as root (debootstrap)" >&2
  exit 2
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9
if [[ -f "$OUT/.torpor-criu" ]]; then verify "$WRAPPER"; done_; fi

PARTIAL="$OUT.partial"
rm -rf "$PARTIAL"
mkdir -p "$PARTIAL"
start=$(date +%s)
echo "build-criu: debootstrap $SUITE (minbase + criu) into $PARTIAL" >&2
if ! debootstrap --variant=minbase --include=criu "$SUITE" "$PARTIAL/root" "$MIRROR" >"$CACHE/$KEY.log" 2>&1; then
  echo "build-criu: debootstrap failed (log: $CACHE/$KEY.log):" >&2
  tail -n 5 "$CACHE/$KEY.log" >&2
  exit 1
fi
mkdir -p "$PARTIAL/bin"
# The wrapper resolves its own location, so the renamed directory keeps working.
cat >"$PARTIAL/bin/criu" <<'EOF'
#!/bin/sh
# CRIU from a Debian sid root, run with that root's loader and libraries (scripts/build-criu.sh).
R=$(dirname "$(dirname "$(readlink -f "$0")")")/root
exec "$R/lib64/ld-linux-x86-64.so.2" --library-path "$R/lib/x86_64-linux-gnu:$R/usr/lib/x86_64-linux-gnu" "$R/usr/sbin/criu" "$@"
EOF
chmod 0755 "$PARTIAL/bin/criu"
verify "$PARTIAL/bin/criu"
"$PARTIAL/bin/criu" --version | head -n 1 >"$PARTIAL/.torpor-criu"
mv -T "$PARTIAL" "$OUT"
echo "build-criu: built $(cat "$OUT/.torpor-criu") in $(( $(date +%s) - start ))s" >&2
done_
