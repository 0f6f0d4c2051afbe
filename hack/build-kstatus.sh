#!/usr/bin/env bash
# Builds hack/kstatus (kstatus-check: what kstatus, the library Flux judges health with, says of each object)
# into a cache outside the repo, once per content of its sources and the Go toolchain, for the GitOps tests
# (testsupport/strata_testsupport/gitops.py). Prints the binary's path on its last line; re-running with it
# present does nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034  # read by go-build.sh
label=kstatus
# shellcheck disable=SC1091  # sourced from this directory
source "$here/go-build.sh"

# A change to main.go, the pinned modules or the toolchain is a new binary; nothing else is.
tag="$( (cd "$here/kstatus" && cat go.mod go.sum main.go && go env GOVERSION) | sha256sum | cut -c1-12)"
bin_dir="${XDG_CACHE_HOME:-$HOME/.cache}/strata/bin/kstatus-${tag}"
lock_bin_dir

static_build kstatus kstatus-check . "" ""
echo "$bin_dir/kstatus-check"
