#!/usr/bin/env bash
# Writes ../argocd-cm.yaml with health/kstatus.lua embedded under the key of each policy kind.
# Run after editing kstatus.lua; test/manifests fails when the two differ.
set -euo pipefail
cd "$(dirname "$0")"
{
	sed -n '/^#/p' ../argocd-cm.yaml | sed -n '1,/kubectl apply --server-side/p'
	cat <<'YAML'
apiVersion: v1
kind: ConfigMap
metadata:
  name: argocd-cm
  namespace: argocd
  labels:
    app.kubernetes.io/name: argocd-cm
    app.kubernetes.io/part-of: argocd
data:
YAML
	for kind in StoragePool Protocol Placement; do
		echo "  resource.customizations.health.policy.plinth.dev_${kind}: |"
		sed 's/^\(.\)/    \1/' kstatus.lua
	done
} > ../argocd-cm.yaml.new
mv ../argocd-cm.yaml.new ../argocd-cm.yaml
