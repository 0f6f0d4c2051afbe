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
      kvserver/strata_kv hack/node/pause.c hack/node/build-images.sh hack/images/build-base.sh \
      -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum) \
    | sha256sum | cut -c1-16
}
archive="$cache/node-images-$(inputs_hash).tar"
if [[ -s "$archive" ]]; then echo "$archive"; exit 0; fi

started_dockerd=""
if ! docker info >/dev/null 2>&1; then
  command -v dockerd >/dev/null || { echo "node images: no dockerd (make system installs docker.io)" >&2; exit 1; }
  # Only for building: no bridge and no iptables rules, so the node's pod network is left alone.
  dockerd --iptables=false --ip-masq=false --bridge=none >"$cache/dockerd.log" 2>&1 &
  started_dockerd=$!
  for _ in $(seq 60); do docker info >/dev/null 2>&1 && break; sleep 1; done
  docker info >/dev/null 2>&1 || { tail -n 20 "$cache/dockerd.log" >&2; exit 1; }
fi
stop_dockerd() { if [[ -n "$started_dockerd" ]]; then kill "$started_dockerd"; wait "$started_dockerd" || true; fi; }
trap stop_dockerd EXIT

start=$SECONDS
base="$(bash "$root/hack/images/build-base.sh")"

# pip inside the build cannot verify this machine's TLS (its CA bundle is the host's, not the image's), so the
# packages are downloaded here, with the host's pip settings, into a wheelhouse the build reads over loopback.
wheelhouse="$cache/wheelhouse"
mkdir -p "$wheelhouse"
python3 -m pip download --quiet --dest "$wheelhouse" "setuptools>=77" wheel pip "${root}[runtime,operator,csi]" >&2
port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
python3 -m http.server --bind 127.0.0.1 --directory "$wheelhouse" "$port" >/dev/null 2>&1 &
server=$!
trap 'kill "$server" 2>/dev/null || true; stop_dockerd' EXIT
for _ in $(seq 50); do python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$port/')" \
  2>/dev/null && break; sleep 0.1; done

echo "node images: building on $base" >&2
PYTHON_IMAGE="$base" IMAGE_PREFIX="$prefix" \
  BUILD_ARGS="--network host --build-arg PIP_FIND_LINKS=http://127.0.0.1:$port/ --build-arg PIP_NO_INDEX=1" \
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
