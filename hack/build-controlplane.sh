#!/usr/bin/env bash
# Builds the local control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok)
# from the upstream Go modules into a cache outside the repo, once. Re-running with the binaries
# present does nothing, so `make setup` stays quick.
#
# Honours KUBEBUILDER_ASSETS: when it points at a directory with etcd and kube-apiserver
# (envtest's convention), nothing is built and that directory is used.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s_version="$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/controlplane/go.mod")"
etcd_version="$(awk '$1=="require" && $2=="go.etcd.io/etcd/server/v3" {print $3}' "$here/etcd/go.mod")"
kwok_version="$(awk '$1=="require" && $2=="sigs.k8s.io/kwok" {print $3}' "$here/kwok/go.mod")"
bin_dir="${STRATA_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/bin/${k8s_version}}"

if [[ -n "${KUBEBUILDER_ASSETS:-}" && -x "${KUBEBUILDER_ASSETS}/kube-apiserver" && -x "${KUBEBUILDER_ASSETS}/etcd" ]]; then
  echo "control plane: using KUBEBUILDER_ASSETS=${KUBEBUILDER_ASSETS}"
  exit 0
fi

mkdir -p "$bin_dir"
# shellcheck disable=SC2034  # read by go-build.sh
label="control plane"
# shellcheck disable=SC1091  # sourced from this directory
source "$here/go-build.sh"

build etcd etcd go.etcd.io/etcd/server/v3
stamp="$(kubernetes_stamp "$k8s_version")"
build controlplane kube-apiserver k8s.io/kubernetes/cmd/kube-apiserver "$stamp"
build controlplane kube-controller-manager k8s.io/kubernetes/cmd/kube-controller-manager "$stamp"
build controlplane kube-scheduler k8s.io/kubernetes/cmd/kube-scheduler "$stamp"
build kwok kwok sigs.k8s.io/kwok/cmd/kwok
# kwok needs its lifecycle stages; take upstream's default set (nodes initialize and heartbeat; pods become
# ready, Job pods complete) from the module cache, as kwokctl does, rather than keeping a copy in this repo.
if [[ ! -s "$bin_dir/kwok-stages.yaml" ]]; then
  kwok_src="$(cd "$here/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)"
  for stage in node/fast/node-initialize node/heartbeat/node-heartbeat pod/fast/pod-ready pod/fast/pod-complete \
               pod/fast/pod-delete; do
    cat "$kwok_src/kustomize/stage/$stage.yaml"
    printf '\n---\n'
  done > "$bin_dir/kwok-stages.yaml.partial.$$"
  mv "$bin_dir/kwok-stages.yaml.partial.$$" "$bin_dir/kwok-stages.yaml"
fi
printf '%s\n' "kubernetes=${k8s_version}" "etcd=${etcd_version}" "kwok=${kwok_version}" > "$bin_dir/VERSIONS"
echo "control plane: binaries ready in $bin_dir"
