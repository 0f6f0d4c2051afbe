#!/usr/bin/env bash
# Builds the local real node's programs into the same cache as the control plane, once: kubelet and
# kube-proxy from the same k8s.io/kubernetes module (hack/controlplane), CoreDNS from its own module
# (hack/coredns, only the plugins cluster DNS needs). The container runtime, runc and the CNI plugins are
# Debian's (hack/setup-system.sh). Re-running with the binaries present does nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
k8s_version="$(awk '$1=="require" && $2=="k8s.io/kubernetes" {print $3}' "$here/controlplane/go.mod")"
bin_dir="${STRATA_BIN_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/bin/${k8s_version}}"
mkdir -p "$bin_dir"

build() {  # build <module dir> <output name> <package> [extra ldflags]
  local dir="$1" name="$2" pkg="$3" extra="${4:-}"
  if [[ -x "$bin_dir/$name" ]]; then return 0; fi
  echo "node: building $name ($pkg) into $bin_dir (first time only; several minutes)"
  local start=$SECONDS
  (cd "$here/$dir" && go build -trimpath -ldflags="-s -w $extra" -o "$bin_dir/$name.partial" "$pkg")
  mv "$bin_dir/$name.partial" "$bin_dir/$name"
  echo "node: built $name in $((SECONDS - start))s"
}

minor="$(cut -d. -f2 <<<"${k8s_version#v}")"
stamp="-X k8s.io/component-base/version.gitVersion=${k8s_version} -X k8s.io/component-base/version.gitMajor=1"
stamp+=" -X k8s.io/component-base/version.gitMinor=${minor} -X k8s.io/component-base/version.gitTreeState=clean"
build controlplane kubelet k8s.io/kubernetes/cmd/kubelet "$stamp"
build controlplane kube-proxy k8s.io/kubernetes/cmd/kube-proxy "$stamp"
build coredns coredns .
echo "node: binaries ready in $bin_dir"
