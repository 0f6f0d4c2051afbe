#!/usr/bin/env bash
# Builds the OCI registry the real-node tests push images to (distribution's registry, pinned in
# hack/registry/go.mod; only the filesystem driver and htpasswd auth, hack/registry/main.go) into a cache outside
# the repo, once per version. Prints the binary's path on its last line; re-running with it present does nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034  # read by go-build.sh
label=registry
# shellcheck disable=SC1091  # sourced from this directory
source "$here/go-build.sh"
module=github.com/distribution/distribution/v3
version="$(pinned_version registry "$module")"
bin_dir="${XDG_CACHE_HOME:-$HOME/.cache}/strata/registry/${version}"
lock_bin_dir

static_build registry registry . "osusergo netgo" "-X $module/version.version=${version}"
echo "$bin_dir/registry"
