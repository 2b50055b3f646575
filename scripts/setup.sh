#!/usr/bin/env bash
# Creates .venv with torpor and its dev tools; installs bubblewrap, nftables and iproute2 when
# missing (root + apt only).
# Idempotent and quick when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

if [[ ! -x .venv/bin/python ]]; then
  "$PYTHON" -m venv .venv
fi
if [[ ! -x .venv/bin/uv ]]; then
  .venv/bin/python -m pip install --quiet --upgrade pip uv
fi
.venv/bin/uv pip install --quiet --python .venv/bin/python -e '.[dev]'

if ! command -v bwrap >/dev/null 2>&1; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing bubblewrap (the local runtime's sandbox)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bubblewrap >/dev/null; }
  else
    echo "setup: bubblewrap is missing; install it with: sudo apt-get install -y bubblewrap" >&2
  fi
fi
# The local runtime's pod network: a network namespace per pod (iproute2), NAT and each sandbox's
# egress policy (nftables), entering the namespace (nsenter, util-linux). Needs root at run time.
# conntrack: the isolation tests forge connection-tracking entries (the guard must not trust them).
if ! command -v nft >/dev/null 2>&1 || ! command -v ip >/dev/null 2>&1 || ! command -v conntrack >/dev/null 2>&1; then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing nftables, iproute2 and conntrack (the local runtime's pod network)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables iproute2 conntrack >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables iproute2 conntrack >/dev/null; }
  else
    echo "setup: nft/ip/conntrack are missing; install them with: sudo apt-get install -y nftables iproute2 conntrack" >&2
  fi
fi
# The real Kubernetes node of the test rig (tests marked `realnode`, bench --node real) and the
# images built here: containerd + runc run the pods, the CNI plugins wire them, buildah builds the
# images without a Docker engine, podman serves testcontainers a Docker-compatible API, skopeo
# copies images between stores, debootstrap makes the Debian base, uidmap for rootless podman.
REALNODE_PKGS=(containerd runc containernetworking-plugins buildah podman skopeo uidmap debootstrap)
REALNODE_MISSING=()
for p in "${REALNODE_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || REALNODE_MISSING+=("$p")
done
if ((${#REALNODE_MISSING[@]})); then
  if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${REALNODE_MISSING[*]} (the real test node and image builds)" >&2
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${REALNODE_MISSING[@]}" >/dev/null \
      || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${REALNODE_MISSING[@]}" >/dev/null; } \
      || echo "setup: could not install ${REALNODE_MISSING[*]} (realnode tests will skip; they fail under CI=true)" >&2
  else
    echo "setup: ${REALNODE_MISSING[*]} missing; install with: sudo apt-get install -y ${REALNODE_MISSING[*]}" >&2
  fi
fi
# The sandbox root filesystem of the local runtime (Debian bookworm + deploy/sandbox-base, built by
# debootstrap, cached in ~/.cache/torpor/rootfs; instant when the package list is unchanged,
# about 4 minutes cold). Without it local sandboxes do not start (one line says why).
if [[ $(id -u) == 0 ]] && command -v debootstrap >/dev/null 2>&1; then
  scripts/build-rootfs.sh >/dev/null \
    || { echo "setup: scripts/build-rootfs.sh failed (local sandboxes cannot start)" >&2; [[ ${CI:-} != true ]]; }
  # code-interpreter-v1's layers (the venv with the Jupyter kernels, the execution server) on that
  # rootfs: cached in ~/.cache/torpor/layers by a hash of their inputs; about a minute cold.
  scripts/build-code-interpreter.sh >/dev/null \
    || { echo "setup: scripts/build-code-interpreter.sh failed (code-interpreter sandboxes cannot start)" >&2; [[ ${CI:-} != true ]]; }
else
  echo "setup: the sandbox rootfs needs root and debootstrap (apt-get install -y debootstrap), then: scripts/build-rootfs.sh" >&2
fi
# Headless Chromium for the dashboard's browser tests (driven by the playwright package; never
# 'playwright install'). Optional: those tests skip without it (and fail under CI=true).
if [[ ! -x /usr/bin/chromium && $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null \
    || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } \
    || echo "setup: could not install chromium (dashboard browser tests will skip)" >&2
fi
# Pods run the daemon from a read-only venv inside bubblewrap, where Python cannot cache bytecode:
# compile once here (PYTHONDONTWRITEBYTECODE may be set in the environment) so pods start fast.
PYTHONDONTWRITEBYTECODE= .venv/bin/python -X pycache_prefix=.venv/var/torpor-pycache -m services.envd --precompile >/dev/null 2>&1 \
  || echo "setup: could not precompile the daemon's bytecode (pods will start slower)" >&2
