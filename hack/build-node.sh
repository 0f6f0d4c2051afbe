#!/usr/bin/env bash
# Builds the local real node's programs into the same cache as the control plane, once: kubelet and
# kube-proxy from the same k8s.io/kubernetes module (hack/controlplane), CoreDNS from its own module
# (hack/coredns, only the plugins cluster DNS needs); containerd 2 (hack/build-containerd.sh) and the OCI registry
# the tests push to (hack/build-registry.sh), each cached by its own version. runc and the CNI plugins are Debian's
# (hack/setup-system.sh). Re-running with the binaries present does nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s_version="$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/controlplane/go.mod")"
bin_dir="${STRATA_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/bin/${k8s_version}}"
mkdir -p "$bin_dir"

# shellcheck disable=SC2034  # read by go-build.sh
label=node
# shellcheck disable=SC1091  # sourced from this directory
source "$here/go-build.sh"
stamp="$(kubernetes_stamp "$k8s_version")"
build controlplane kubelet k8s.io/kubernetes/cmd/kubelet "$stamp"
build controlplane kube-proxy k8s.io/kubernetes/cmd/kube-proxy "$stamp"
# A coredns cached before the plugins kubeadm's Corefile names were added (hack/coredns/main.go) is built again.
# `coredns -plugins` lists one plugin a line, bare (`forward`) or, from older builds, under its server type
# (`dns.forward`); the list is read whole first, as `| grep -q` under pipefail fails when coredns dies of SIGPIPE.
if [[ -x "$bin_dir/coredns" ]] && ! grep -qE '(^|[[:space:].])forward$' <<<"$("$bin_dir/coredns" -plugins)"; then
  rm -f "$bin_dir/coredns"
fi
build coredns coredns .
bash "$here/build-containerd.sh" >/dev/null
bash "$here/build-registry.sh" >/dev/null
echo "node: binaries ready in $bin_dir"
