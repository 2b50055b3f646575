#!/usr/bin/env bash
# Builds go-containerregistry's crane (its `registry serve` is the OCI registry the Kubernetes
# test rig runs: plain HTTP, blobs on disk) from the Go module proxy into a cache folder outside
# the repo. Idempotent and flock-guarded like build-k8s.sh; prints the binary's path (last line).
set -euo pipefail
export GOTOOLCHAIN=local CGO_ENABLED=0
RV=${TORPOR_REGISTRY_VERSION:-v0.22.1}
OUT=${TORPOR_REGISTRY_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/torpor/registry/$RV}
BIN="$OUT/crane"
if [[ -x "$BIN" ]]; then echo "$BIN"; exit 0; fi
command -v go >/dev/null || { echo "build-registry: go is not installed" >&2; exit 2; }
mkdir -p "$OUT"
exec 9>"$OUT.lock"
flock 9
if [[ -x "$BIN" ]]; then echo "$BIN"; exit 0; fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cd "$W"
go mod init example.invalid/registry-testbin >/dev/null 2>&1
go mod edit -require="github.com/google/go-containerregistry@$RV"
cat > tools.go <<'GO'
//go:build tools

package tools

import _ "github.com/google/go-containerregistry/cmd/crane"
GO
echo "build-registry: compiling crane $RV" >&2
go mod tidy >&2
go build -trimpath -ldflags "-s -w" -o "$W/crane" github.com/google/go-containerregistry/cmd/crane >&2
mv -f "$W/crane" "$BIN"
echo "$BIN"
