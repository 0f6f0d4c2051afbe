#!/usr/bin/env bash
# Builds the Helm CLI from its upstream Go module (pinned in hack/helm/go.mod) into a cache outside
# the repo, once, for the chart tests and `make e2e`. Prints the binary's path on its last line.
# Re-running with the binary present does nothing. HELM (an existing helm binary) skips the build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034  # read by go-build.sh
label=helm
# shellcheck disable=SC1091  # sourced from this directory: the project's Go build cache
source "$here/go-build.sh"
helm_version="$(awk '$1=="require" && $2=="helm.sh/helm/v3" {print $3}' "$here/helm/go.mod")"
# Helm's own Makefile stamps the Kubernetes version of its client-go into the binary; without it `helm template`
# assumes Kubernetes v1.20 and refuses charts that need newer (and lint checks deprecations against 1.20).
k8s_minor="$(awk '$1=="k8s.io/client-go" {split($2, v, "."); print v[2]}' "$here/helm/go.mod")"
bin_dir="${XDG_CACHE_HOME:-$HOME/.cache}/strata/bin/helm-${helm_version}"

if [[ -n "${HELM:-}" && -x "${HELM}" ]]; then
  echo "helm: using HELM=${HELM}" >&2
  echo "$HELM"
  exit 0
fi

if [[ ! -x "$bin_dir/helm" ]]; then
  mkdir -p "$bin_dir"
  echo "helm: building ${helm_version} into $bin_dir (first time only; a few minutes)" >&2
  start=$SECONDS
  # Helm reads its own version from internal/version; without -X it reports only "v3.22".
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${helm_version}"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X ${pkg}.k8sVersionMajor=1 -X ${pkg}.k8sVersionMinor=${k8s_minor}"
  done
  (cd "$here/helm" && CGO_ENABLED=0 go build -trimpath -ldflags="$ldflags" -o "$bin_dir/helm.partial.$$" helm.sh/helm/v3/cmd/helm)
  mv "$bin_dir/helm.partial.$$" "$bin_dir/helm"
  echo "helm: built in $((SECONDS - start))s" >&2
fi
echo "$bin_dir/helm"
