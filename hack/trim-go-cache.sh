#!/usr/bin/env bash
# Lets the project's Go build cache go once every Go binary is built and cached (`make setup` runs it last): the
# binaries are kept by version under ~/.cache/strata/bin and friends, so the compiled packages behind them (about
# 6.6 GB on a first build) would only take disk the kind tier needs. A later build (a new pinned version) starts
# with an empty cache, as on a fresh machine. Skipped while any build script holds the cache (another session's
# setup), so nothing is pulled from under a running build.
set -euo pipefail

cache="${XDG_CACHE_HOME:-$HOME/.cache}/strata/go-build"
[[ -d "$cache" ]] || exit 0
exec 7>"$cache.lock"
if ! flock -n -x 7; then
  echo "go build cache: in use by a build, kept ($cache)" >&2
  exit 0
fi
size="$(du -sh "$cache" | cut -f1)"
rm -rf "$cache"
echo "go build cache: let go of $size ($cache); the binaries it built stay cached" >&2
