#!/usr/bin/env bash
# Builds the serving image (images/vllm-cpu/Dockerfile, VARIANT=cpu: vllm-cpu + Strata's vLLM packages) with no
# pull, into two zstd archives in the cache outside the repo, apart from the node-images archive (whose key changes
# with every change to the code). `build-serving-image.sh stock` builds the Dockerfile's `stock` stage instead: the
# same engine with nothing of Strata's (STOCK_IMAGE, default localhost/vllm-cpu:stock), for the test that serves
# from a vLLM-only image with the packages the webhook adds at admission.
#   vllm-cpu-engine-<key>.tar.zst  the engine stage: the local Debian base + the vllm-cpu venv (~6 GB). Keyed by that
#                                  stage's text, the venv's pins, build script and kernel check, the base's script: built once.
#                                  Its wheelhouse is exactly the CPU test venv's packages (`pip freeze` of the venv
#                                  hack/build-vllm-venv.sh builds), so the image runs the versions the tests run;
#                                  downloaded here (hack/images/lib.sh says why) and removed after the build.
#   strata-vllm-<key>.tar.zst      the serving image SERVING_IMAGE: the engine + Strata's vLLM packages. Keyed by the
#                                  engine's key, the Dockerfile and those packages' sources; rebuilt from the engine
#                                  archive when Strata's code changes (vLLM is not installed again). Newest kept.
#   vllm-stock-<key>.tar.zst       (`stock`) the stock image: the engine + a non-root user and vLLM's server as the
#                                  command. Keyed by the engine's key, the Dockerfile and this script; built from the
#                                  engine archive (nothing downloaded), once. Newest kept.
# The real node imports the serving archive only for the tests that serve a model. Docker keeps nothing: the images
# and the build cache are removed once the archives are written. One build at a time (a lock in the cache).
#
# Output: the archive's path on stdout. Starts dockerd for the build when none is running, and stops it after.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/strata/images"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -n1)"
target="${1:-serving}"
case "$target" in
  serving) ref="${SERVING_IMAGE:-localhost/strata-vllm:cpu}" ;;
  stock) ref="${STOCK_IMAGE:-localhost/vllm-cpu:stock}" ;;
  *) echo "usage: $0 [serving|stock]" >&2; exit 2 ;;
esac
dockerfile="$root/images/vllm-cpu/Dockerfile"
requirements="$root/hack/vllm/cpu/requirements.txt"
mkdir -p "$cache"
exec 9>"$cache/serving-image.lock"
flock 9

# shellcheck disable=SC2016  # the sed address names the Dockerfile's literal ${VLLM_GPU_IMAGE}
engine_key="$(cd "$root" && { sed -n '1,/^FROM \${VLLM_GPU_IMAGE}/p' "$dockerfile"; \
  cat hack/build-vllm-venv.sh hack/vllm/cpu/requirements.txt hack/vllm/cpu/check-kernels.py hack/images/build-base.sh; \
  } | sha256sum | cut -c1-16)"
serving_key="$(cd "$root" && { echo "$engine_key $ref"; find images/vllm-cpu .dockerignore pyproject.toml README.md \
  units/strata_units loader/strata_loader kvserver/strata_kv hack/node/build-serving-image.sh hack/images/lib.sh \
  -type f -not -path '*/__pycache__/*' -not -name '*.pyc' -print0 | sort -z | xargs -0 sha256sum; } \
  | sha256sum | cut -c1-16)"
stock_key="$(cd "$root" && { echo "$engine_key $ref"; cat images/vllm-cpu/Dockerfile hack/node/build-serving-image.sh \
  hack/images/lib.sh; } | sha256sum | cut -c1-16)"
engine="$cache/vllm-cpu-engine-$engine_key.tar.zst"
engine_ref="localhost/strata-vllm-engine:$engine_key"
if [[ "$target" == stock ]]; then
  output="$cache/vllm-stock-$stock_key.tar.zst" kept="vllm-stock-*.tar.zst"
else
  output="$cache/strata-vllm-$serving_key.tar.zst" kept="strata-vllm-*.tar.zst"
fi
if [[ -s "$output" ]]; then echo "$output"; exit 0; fi

# shellcheck source=hack/images/lib.sh
source "$root/hack/images/lib.sh"
wheelhouse=""
cleanup() {
  stop_wheelhouse
  [[ -z "$wheelhouse" ]] || rm -rf "$wheelhouse"
  # Removing the tagged images removes their untagged parents (the build's steps); the daemon's dangling images
  # and build cache are pruned only when no one else's build may be using this daemon.
  docker image rm --force "$ref" "$engine_ref" >/dev/null 2>&1 || true
  if [[ -n "$started_dockerd" ]]; then
    docker image prune --force >/dev/null 2>&1 || true
    docker builder prune --force >/dev/null 2>&1 || true
  fi
  stop_dockerd
}
trap cleanup EXIT
ensure_dockerd "$cache/dockerd.log"
base="$(bash "$root/hack/images/build-base.sh")"
# The classic builder (no buildx here) builds every stage before the target: the GPU stage starts from the local
# base so nothing is pulled; it is not part of the CPU image.
args=(--file "$dockerfile" --network host --build-arg "VLLM_GPU_IMAGE=$base" --build-arg "VERSION=$version")

if [[ ! -s "$engine" ]]; then
  start=$SECONDS
  vpy="$(bash "$root/hack/build-vllm-venv.sh" "$requirements" | tail -n1)"
  wheelhouse="$(mktemp -d "$cache/wheelhouse-vllm.XXXXXX")"
  "$vpy" -m pip freeze --all > "$wheelhouse/lock.txt"
  echo "serving image: downloading $(wc -l < "$wheelhouse/lock.txt") packages into $wheelhouse" >&2
  # The venv's own pip: its HTTP cache (http-v2) holds the wheels it just installed, so on a first run this is a
  # copy from that cache, not a second 3 GB download (an older pip, as Debian's python3 may have, keeps another).
  "$vpy" -m pip download --quiet --no-deps --only-binary=:all: --dest "$wheelhouse" -r "$wheelhouse/lock.txt" >&2
  echo "serving image: wheelhouse $(du -sh "$wheelhouse" | cut -f1) in $((SECONDS - start))s" >&2
  serve_wheelhouse "$wheelhouse"
  docker build "${args[@]}" --target engine-cpu --build-arg "PYTHON_IMAGE=$base" \
    --build-arg "PIP_FIND_LINKS=$wheelhouse_url" --build-arg PIP_NO_INDEX=1 --tag "$engine_ref" "$root" >&2
  stop_wheelhouse
  rm -rf "$wheelhouse"
  wheelhouse=""
  echo "serving image: engine built in $((SECONDS - start))s" >&2
  rm -f "$cache"/vllm-cpu-engine-*.tar.zst
  docker save "$engine_ref" | zstd --quiet -T0 -3 -o "$engine.partial"
  mv "$engine.partial" "$engine"
  echo "serving image: engine archive $(du -h "$engine" | cut -f1) after $((SECONDS - start))s" >&2
elif ! docker image inspect "$engine_ref" >/dev/null 2>&1; then
  zstd --quiet -dc "$engine" | docker load >&2
fi

start=$SECONDS
# Starting from the engine image, the engine stage finds its venv complete and installs nothing.
docker build "${args[@]}" --target "$target" --build-arg "PYTHON_IMAGE=$engine_ref" --tag "$ref" "$root" >&2
echo "serving image: $ref $(docker image inspect --format '{{.Size}}' "$ref" | awk '{printf "%.0f MB", $1/1e6}')" >&2
# shellcheck disable=SC2086  # $kept is a glob on purpose
rm -f "$cache"/$kept
docker save "$ref" | zstd --quiet -T0 -3 -o "$output.partial"
mv "$output.partial" "$output"
echo "serving image: archive $(du -h "$output" | cut -f1), $target stage and archive in $((SECONDS - start))s" >&2
echo "$output"
