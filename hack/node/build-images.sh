#!/usr/bin/env bash
# Builds what the local real node runs, with no image pull: the Debian base (hack/images/build-base.sh),
# Strata's operator and runtime images on it (images/build.sh), and a pause image from a static binary
# (hack/node/pause.c). All three are saved into one archive in the cache outside the repo, named by a hash of
# everything that goes into them, so an unchanged tree reuses it and the node imports it into its runtime.
#
# Output: the archive's path on stdout. Starts dockerd for the build when none is running, and stops it after.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/strata/images"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -n1)"
prefix="${IMAGE_PREFIX-ghcr.io/strata-dev/}"
pause_ref="localhost/strata-pause:1"
mkdir -p "$cache"

inputs_hash() {  # what the images are made of: Dockerfiles, packaging, the packages, these scripts
  (cd "$root" && find images pyproject.toml README.md units/strata_units operator/strata_operator loader/strata_loader \
      kvserver/strata_kv hack/node/pause.c hack/node/build-images.sh hack/images/build-base.sh hack/images/lib.sh \
      -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum) \
    | sha256sum | cut -c1-16
}
archive="$cache/node-images-$(inputs_hash).tar"
if [[ -s "$archive" ]]; then echo "$archive"; exit 0; fi

# shellcheck source=hack/images/lib.sh
source "$root/hack/images/lib.sh"
trap 'stop_wheelhouse; stop_dockerd' EXIT
ensure_dockerd "$cache/dockerd.log"

start=$SECONDS
base="$(bash "$root/hack/images/build-base.sh")"

# The packages, downloaded here into a wheelhouse the build reads over loopback (hack/images/lib.sh says why).
wheelhouse="$cache/wheelhouse"
mkdir -p "$wheelhouse"
python3 -m pip download --quiet --dest "$wheelhouse" "setuptools>=77" wheel pip "${root}[runtime,operator,csi]" >&2
serve_wheelhouse "$wheelhouse"

echo "node images: building on $base" >&2
PYTHON_IMAGE="$base" IMAGE_PREFIX="$prefix" \
  BUILD_ARGS="--network host --build-arg PIP_FIND_LINKS=$wheelhouse_url --build-arg PIP_NO_INDEX=1" \
  bash "$root/images/build.sh" >&2

pause_dir="$(mktemp -d)"
gcc -static -O2 -o "$pause_dir/pause" "$root/hack/node/pause.c"
tar -C "$pause_dir" -cf - pause | docker import --change 'ENTRYPOINT ["/pause"]' - "$pause_ref" >/dev/null
rm -rf "$pause_dir"

refs=("${prefix}strata-operator:$version" "${prefix}strata-runtime:$version" "$pause_ref")
for ref in "${refs[@]}"; do
  echo "node images: $ref $(docker image inspect --format '{{.Size}}' "$ref" | awk '{printf "%.0f MB", $1/1e6}')" >&2
done
rm -f "$cache"/node-images-*.tar
docker save "${refs[@]}" -o "$archive.partial"
mv "$archive.partial" "$archive"
echo "node images: built in $((SECONDS - start))s" >&2
echo "$archive"
