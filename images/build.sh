#!/usr/bin/env bash
# Builds Strata's two images from the repo root (`make images`):
#   strata-operator:<tag>  images/operator/Dockerfile   the kopf operator
#   strata-runtime:<tag>   images/runtime/Dockerfile    strata-loader (preloader Jobs) + strata-kv (KV servers)
# The tag defaults to the version in pyproject.toml, which is the chart's appVersion (the chart's default tag).
#
# Environment:
#   IMAGE_PREFIX   prepended to both names (default: ghcr.io/strata-dev/, the chart's default repositories;
#                  set it empty for bare local names)
#   IMAGE_TAG      overrides the tag
#   KIND_CLUSTER   when set, also `kind load docker-image` both images into that kind cluster
#   DOCKER         the docker CLI (default: docker)
#   PYTHON_IMAGE   the Python 3.11 base (default: the Dockerfiles' python:3.11-slim-bookworm;
#                  hack/images/build-base.sh builds a local one from Debian's packages)
#   BUILD_ARGS     extra arguments for `docker build` (e.g. "--network host")
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
docker="${DOCKER:-docker}"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$root/pyproject.toml" | head -n1)"
tag="${IMAGE_TAG:-$version}"
prefix="${IMAGE_PREFIX-ghcr.io/strata-dev/}"

if ! command -v "$docker" >/dev/null 2>&1; then
  echo "images: no '$docker' CLI on PATH; install Docker (or set DOCKER) to build the images" >&2
  exit 1
fi
if ! "$docker" info >/dev/null 2>&1; then
  echo "images: '$docker' cannot reach a Docker daemon; start it and retry" >&2
  exit 1
fi

base_arg=()
[[ -z "${PYTHON_IMAGE:-}" ]] || base_arg=(--build-arg "PYTHON_IMAGE=$PYTHON_IMAGE")
# BuildKit needs the buildx plugin with newer CLIs; without it, the classic builder builds these files the same.
buildkit=1
"$docker" buildx version >/dev/null 2>&1 || buildkit=0

built=()
for image in operator runtime; do
  ref="${prefix}strata-${image}:${tag}"
  echo "images: building $ref"
  # shellcheck disable=SC2086  # BUILD_ARGS is a list of words on purpose
  DOCKER_BUILDKIT=$buildkit "$docker" build --file "$root/images/$image/Dockerfile" --build-arg "VERSION=$tag" \
    "${base_arg[@]}" ${BUILD_ARGS:-} --tag "$ref" "$root"
  built+=("$ref")
done

if [[ -n "${KIND_CLUSTER:-}" ]]; then
  for ref in "${built[@]}"; do
    echo "images: loading $ref into kind cluster $KIND_CLUSTER"
    kind load docker-image --name "$KIND_CLUSTER" "$ref"
  done
fi
printf '%s\n' "${built[@]}"
