#!/usr/bin/env bash
# Install the kustomize binary from the Go module proxy into ~/.cache/torpor/bin (idempotent,
# keyed by version; prints the binary's path). Used by tests/deploy when neither kustomize nor
# kubectl is on PATH. Needs Go >= 1.22.
set -euo pipefail
VERSION=${KUSTOMIZE_VERSION:-v5.5.0}
BIN=${TORPOR_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/torpor/bin}
OUT="$BIN/kustomize-$VERSION"
if [[ -x "$OUT" ]]; then echo "$OUT"; exit 0; fi
mkdir -p "$BIN"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
GOBIN="$tmp" CGO_ENABLED=0 GOFLAGS=-mod=mod go install "sigs.k8s.io/kustomize/kustomize/v5@$VERSION" >&2
mv "$tmp/kustomize" "$OUT"
echo "$OUT"
