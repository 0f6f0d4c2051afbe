#!/usr/bin/env bash
# Builds the real node's container runtime from containerd's Go module (pinned in hack/containerd/go.mod) into a
# cache outside the repo, once per version: containerd, its runc shim (containerd-shim-runc-v2) and ctr. Debian's
# containerd is 1.6, which can neither mount image volumes (containerd >= 2.1; subPath >= 2.2) nor answer the
# kubelet's CRI RuntimeConfig call; runc and the CNI plugins stay Debian's (hack/setup-system.sh).
#
# Static, cgo-free builds as upstream releases the shim; the snapshotters that need cgo or kernel support this
# machine lacks (btrfs, devmapper, zfs) are left out. Prints the directory on its last line; re-running with the
# binaries present does nothing.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck disable=SC2034  # read by go-build.sh
label=containerd
# shellcheck disable=SC1091  # sourced from this directory
source "$here/go-build.sh"
module=github.com/containerd/containerd/v2
version="$(pinned_version containerd "$module")"
bin_dir="${XDG_CACHE_HOME:-$HOME/.cache}/strata/containerd/${version}"
lock_bin_dir

stamp="-X $module/version.Version=${version} -X $module/version.Package=$module"
tags="urfave_cli_no_docs osusergo netgo static_build no_btrfs no_devmapper no_zfs"
static_build containerd containerd "$module/cmd/containerd" "$tags" "$stamp"
static_build containerd containerd-shim-runc-v2 "$module/cmd/containerd-shim-runc-v2" "$tags no_grpc" "$stamp"
static_build containerd ctr "$module/cmd/ctr" "$tags" "$stamp"
echo "$bin_dir"
