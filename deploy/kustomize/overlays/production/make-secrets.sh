#!/usr/bin/env bash
# Create the Secrets the production overlay expects, with fresh random hex passwords (hex is
# safe anywhere: NATS_PASSWORD, or a NATS_URL an operator writes by hand). Prints the
# bootstrap API key once.
#   NAMESPACE=torpor BOOTSTRAP_USER=admin deploy/kustomize/overlays/production/make-secrets.sh
set -euo pipefail
ns=${NAMESPACE:-torpor}
user=${BOOTSTRAP_USER:-admin}
pw() { od -An -tx1 -N24 /dev/urandom | tr -d ' \n'; }
kubectl get namespace "$ns" >/dev/null 2>&1 || kubectl create namespace "$ns"
args=()
for u in admin api proxy scheduler snapshotter scaler deliverer ledger builder platform route; do
  args+=("--from-literal=$u=$(pw)")
done
kubectl -n "$ns" create secret generic torpor-nats-auth "${args[@]}"
key="torpor_$(pw)"
kubectl -n "$ns" create secret generic torpor-api-keys \
  --from-literal=bootstrap-user="$user" --from-literal=bootstrap-api-key="$key"
echo "bootstrap API key for $user (store it now, it is not shown again): $key"
