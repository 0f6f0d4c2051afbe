#!/usr/bin/env bash
# Builds what the kind tier (e2e/) needs beyond the real node's programs, once: the kind CLI from its Go module
# (pinned in hack/kind/go.mod, cached per version), and kubeadm and kubectl (kind runs both inside its nodes) from
# the same k8s.io/kubernetes build as the control plane (hack/controlplane, cached beside kube-apiserver). The node
# image itself is hack/kind/build-node-image.sh.
#
# Prints the kind binary's path on its last line; re-running with the binaries present does nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034  # read by go-build.sh
label=kind
# shellcheck disable=SC1091  # sourced from this directory
source "$here/go-build.sh"

k8s_version="$(pinned_version controlplane k8s.io/kubernetes)"
bin_dir="${STRATA_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/bin/${k8s_version}}"
mkdir -p "$bin_dir"
stamp="$(kubernetes_stamp "$k8s_version")"
build controlplane kubeadm k8s.io/kubernetes/cmd/kubeadm "$stamp"
build controlplane kubectl k8s.io/kubernetes/cmd/kubectl "$stamp"

kind_version="$(pinned_version kind sigs.k8s.io/kind)"
bin_dir="${XDG_CACHE_HOME:-$HOME/.cache}/strata/kind/${kind_version}"
lock_bin_dir
static_build kind kind sigs.k8s.io/kind "" ""
echo "$bin_dir/kind"
