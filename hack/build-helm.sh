#!/usr/bin/env bash
# Builds the Helm CLI from its upstream Go module (pinned in hack/helm/go.mod) into a cache outside
# the repo, once, for the chart tests and `make e2e`. Prints the binary's path on its last line.
# Re-running with the binary present does nothing. HELM (an existing helm binary) skips the build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
helm_version="$(awk '$1=="require" && $2=="helm.sh/helm/v3" {print $3}' "$here/helm/go.mod")"
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
  (cd "$here/helm" && go build -trimpath \
    -ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=${helm_version}" \
    -o "$bin_dir/helm.partial" helm.sh/helm/v3/cmd/helm)
  mv "$bin_dir/helm.partial" "$bin_dir/helm"
  echo "helm: built in $((SECONDS - start))s" >&2
fi
echo "$bin_dir/helm"
