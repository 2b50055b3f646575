#!/usr/bin/env bash
# Builds sandbox-base's root filesystem for the local runtime: Debian bookworm from
# deb.debian.org (debootstrap --variant=minbase), the packages of deploy/sandbox-base/packages.txt,
# then deploy/sandbox-base/configure.sh (user `user`, passwordless sudo through torpor's shim).
#
# Cached outside the repo in ${TORPOR_ROOTFS_CACHE:-~/.cache/torpor/rootfs}/<hash>, where <hash>
# covers the package list and every file of the build (rebuilt only when one changes). Built
# into <hash>.partial, then renamed; concurrent builds wait on a lock. Needs root (debootstrap,
# chroot) and network access to deb.debian.org. Prints the rootfs path on stdout (last line);
# progress goes to stderr. A host without debootstrap gets one line and exit 2.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
BASE="$REPO/deploy/sandbox-base"
CACHE=${TORPOR_ROOTFS_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/torpor/rootfs}
MIRROR=${TORPOR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm

HASH=$(cat "$BASE/packages.txt" "$BASE/configure.sh" "$BASE/sudo" "$0" | sha256sum | cut -c1-16)
OUT="$CACHE/$HASH"
# `current` names the newest build: the local runtime's default rootfs (TORPOR_ROOTFS overrides).
done_() { ln -sfn "$HASH" "$CACHE/.current.new" && mv -T "$CACHE/.current.new" "$CACHE/current"; echo "$OUT"; exit 0; }
if [[ -f "$OUT/etc/torpor-rootfs" ]]; then done_; fi

if ! command -v debootstrap >/dev/null 2>&1; then
  echo "build-rootfs: debootstrap is not installed (apt-get install -y debootstrap); local sandboxes need the sandbox-base rootfs it builds" >&2
  exit 2
fi
if [[ $(id -u) != 0 ]]; then
  echo "build-rootfs: must run as root (debootstrap and chroot)" >&2
  exit 2
fi

mkdir -p "$CACHE"
# One build per machine: concurrent callers (CI jobs, test sessions) wait for it.
exec 9>"$CACHE/.lock"
flock 9
if [[ -f "$OUT/etc/torpor-rootfs" ]]; then done_; fi

PARTIAL="$OUT.partial"
cleanup() {
  for m in proc dev/pts dev; do
    if mountpoint -q "$PARTIAL/$m" 2>/dev/null; then umount -l "$PARTIAL/$m" || true; fi
  done
}
trap cleanup EXIT
cleanup
rm -rf "$PARTIAL"
mkdir -p "$PARTIAL"
mapfile -t PACKAGES < <(sed -e 's/#.*//' -e 's/[[:space:]]//g' "$BASE/packages.txt" | grep -v '^$')
for p in "${PACKAGES[@]}"; do
  [[ $p =~ ^[a-z0-9][a-z0-9.+-]+$ ]] || { echo "build-rootfs: bad package name '$p' in packages.txt" >&2; exit 2; }
done

start=$(date +%s)
echo "build-rootfs: debootstrap $SUITE (minbase) into $PARTIAL" >&2
debootstrap --variant=minbase "$SUITE" "$PARTIAL" "$MIRROR" >&2
cat > "$PARTIAL/etc/apt/sources.list" <<EOF
deb $MIRROR $SUITE main
deb $MIRROR $SUITE-updates main
deb ${TORPOR_DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security} $SUITE-security main
EOF
cp /etc/resolv.conf "$PARTIAL/etc/resolv.conf"
mount -t proc proc "$PARTIAL/proc"
mount --bind /dev "$PARTIAL/dev"
mount --bind /dev/pts "$PARTIAL/dev/pts"
in_root() { chroot "$PARTIAL" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive LANG=C.UTF-8 "$@"; }
echo "build-rootfs: installing ${#PACKAGES[@]} packages" >&2
in_root apt-get update -qq >&2
in_root apt-get install -y -qq --no-install-recommends "${PACKAGES[@]}" >&2
in_root apt-get upgrade -y -qq >&2
cp "$BASE/sudo" "$PARTIAL/tmp/torpor-sudo"
cp "$BASE/configure.sh" "$PARTIAL/tmp/torpor-configure.sh"
in_root /bin/sh /tmp/torpor-configure.sh /tmp/torpor-sudo >&2
rm -f "$PARTIAL/tmp/torpor-sudo" "$PARTIAL/tmp/torpor-configure.sh"
cleanup
# The pod gets its own resolv.conf, hosts and hostname at start; nothing of the build host stays.
: > "$PARTIAL/etc/resolv.conf"
echo "sandbox-base $HASH $(date -u +%FT%TZ)" > "$PARTIAL/etc/torpor-rootfs"
mv "$PARTIAL" "$OUT"
# Older builds stay (running pods may use them as their lower layer); remove them by hand.
echo "build-rootfs: built in $(( $(date +%s) - start ))s" >&2
done_
