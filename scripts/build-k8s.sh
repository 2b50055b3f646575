#!/usr/bin/env bash
# Builds kube-apiserver, kube-controller-manager, kube-scheduler, kubelet, kube-proxy and etcd from Go modules into a cache
# folder outside the repo. Idempotent: returns at once when the binaries for this version exist,
# and builds only the missing ones otherwise (a cache made before kubelet was added gains it alone).
# Prints the output folder on stdout (last line); progress goes to stderr.
set -euo pipefail
export GOTOOLCHAIN=local CGO_ENABLED=0
KV=${TORPOR_K8S_VERSION:-1.36.3}
EV=${TORPOR_ETCD_VERSION:-v3.6.8}
OUT=${TORPOR_K8S_BIN:-${XDG_CACHE_HOME:-$HOME/.cache}/torpor/k8s/v$KV}
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy etcd)

have_all() { for b in "${BINS[@]}"; do [[ -x "$OUT/$b" ]] || return 1; done; }
missing() { for b in "${BINS[@]}"; do [[ -x "$OUT/$b" ]] || echo "$b"; done; }
if have_all; then echo "$OUT"; exit 0; fi

command -v go >/dev/null || { echo "build-k8s: go is not installed" >&2; exit 2; }
mkdir -p "$OUT"
# One build per machine: concurrent callers (parallel CI jobs, test sessions) wait for it.
exec 9>"$OUT.lock"
flock 9
if have_all; then echo "$OUT"; exit 0; fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
cd "$W"
go mod init example.invalid/k8s-testbin >/dev/null 2>&1
UP=$(go list -m -json "k8s.io/kubernetes@v$KV" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
go mod edit -go="$(awk '/^go /{print $2; exit}' "$UP")"
grep -E '^godebug ' "$UP" | sed 's/^godebug //' | while read -r kv; do go mod edit -godebug="$kv"; done || true
go mod edit -require="k8s.io/kubernetes@v$KV"
for m in $(awk '$2=="v0.0.0" && $1 ~ /^k8s\.io\//{print $1}' "$UP"); do
  go mod edit -replace="$m=$m@v0.${KV#1.}"
done
go mod edit -require="go.etcd.io/etcd/server/v3@$EV"
cat > tools.go <<'GO'
//go:build tools

package tools

import (
	_ "go.etcd.io/etcd/server/v3"
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
GO
echo "build-k8s: resolving modules for v$KV (etcd $EV)" >&2
go mod tidy >&2
MAJ=${KV%%.*}; MIN=${KV#*.}; MIN=${MIN%%.*}
LD="-s -w"
for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
  LD+=" -X $p.gitVersion=v$KV -X $p.gitMajor=$MAJ -X $p.gitMinor=$MIN -X $p.gitTreeState=clean"
done
# Build next to $OUT and rename at the end, so an interrupted build never looks complete.
PART="$OUT.partial"; rm -rf "$PART"; mkdir -p "$PART"
mapfile -t TODO < <(missing)
KUBE=()
for b in "${TODO[@]}"; do [[ $b == etcd ]] || KUBE+=("k8s.io/kubernetes/cmd/$b"); done
if ((${#KUBE[@]})); then
  echo "build-k8s: compiling ${KUBE[*]##*/} (20-35 minutes cold, about a minute per binary with a warm Go cache)" >&2
  go build -trimpath -ldflags "$LD" -o "$PART/" "${KUBE[@]}" >&2
fi
if [[ " ${TODO[*]} " == *" etcd "* ]]; then
  echo "build-k8s: compiling etcd" >&2
  go build -trimpath -ldflags "-s -w" -o "$PART/etcd" go.etcd.io/etcd/server/v3 >&2
fi
for b in "${TODO[@]}"; do mv -f "$PART/$b" "$OUT/$b"; done
rmdir "$PART"
have_all
echo "$OUT"
