#!/usr/bin/env bash
# Regenerate services/envd/gen/ from the .proto files beside this script.
# Generators (dev-only, not runtime deps):
#   uv pip install 'protoc-gen-py==0.6.0' 'protoc-gen-connectrpc==0.12.1'
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../../.." && pwd)"
venv="${VENV:-$repo/.venv}"
out="$repo/services/envd/gen"
rm -rf "$out"
mkdir -p "$out"
PATH="$venv/bin:$PATH" "$venv/bin/python" -m grpc_tools.protoc -I "$here" \
  --py_out="$out" --connectrpc_out="$out" \
  process/process.proto filesystem/filesystem.proto
touch "$out/__init__.py" "$out/process/__init__.py" "$out/filesystem/__init__.py"
