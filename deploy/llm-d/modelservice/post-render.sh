#!/bin/sh
# Helm post-renderer for llm-d's ModelService chart: reads the chart's manifests on stdin and
# writes them with kvsi added: an ingest sidecar in every vLLM pod the chart serves with
# (components/llm-d-modelservice, then components/sidecar) and kvsi's API replicas and
# configuration (deploy/llm-d/modelservice/kustomization.yaml). Needs kubectl (>= 1.27).
#   helm install ms llm-d-modelservice/llm-d-modelservice -f values.yaml \
#     --post-renderer deploy/llm-d/modelservice/post-render.sh
# KVSI_SIDECAR=sidecar-plain picks the plain-container form (clusters older than 1.29).
set -eu
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# kustomize takes no absolute path to a kustomization: name this folder from the work folder.
here=$(realpath --relative-to="$work" "$(dirname "$0")")
components=$here/../../components
cat > "$work/chart.yaml"
cat > "$work/kustomization.yaml" <<KUSTOMIZATION
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
  - chart.yaml
  - $here
components:
  - $components/llm-d-modelservice
  - $components/${KVSI_SIDECAR:-sidecar}
KUSTOMIZATION
"${KUBECTL:-kubectl}" kustomize "$work"
