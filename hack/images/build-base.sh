#!/usr/bin/env bash
# Builds the local base image Strata's Dockerfiles take as PYTHON_IMAGE when no registry can be reached:
# a minimal Debian bookworm root filesystem (debootstrap --variant=minbase) with Debian's python3.11, written
# as a tarball into the cache outside the repo and imported into Docker. Users with a registry keep the
# public python:3.11-slim-bookworm default.
#
# The Debian mirror is the one apt on this machine already uses (its sources list), so nothing here names a
# host. Re-running with the image present does nothing.
#
# Output: the image reference on stdout (default strata-base:bookworm-python3.11).
set -euo pipefail

ref="${BASE_IMAGE:-strata-base:bookworm-python3.11}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/strata/images"
tarball="$cache/base-bookworm-python3.11.tar"
docker="${DOCKER:-docker}"

if "$docker" image inspect "$ref" >/dev/null 2>&1; then echo "$ref"; exit 0; fi

apt_mirror() {  # the first Debian archive URI in apt's sources (deb822 or one-line format)
  local uri
  uri="$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' | grep -v security | head -n1)"
  [[ -n "$uri" ]] || uri="$(grep -hsE '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list \
                            | awk '{print $2}' | grep -v security | head -n1)"
  [[ -n "$uri" ]] || { echo "base image: no Debian mirror in apt's sources" >&2; return 1; }
  echo "$uri"
}

if [[ ! -s "$tarball" ]]; then
  command -v debootstrap >/dev/null || { echo "base image: debootstrap missing (make system installs it)" >&2; exit 1; }
  mkdir -p "$cache"
  rootfs="$(mktemp -d "$cache/rootfs.XXXXXX")"
  trap 'rm -rf "$rootfs"' EXIT
  start=$SECONDS
  echo "base image: debootstrap bookworm minbase + python3.11 (first time only; a few minutes)" >&2
  debootstrap --variant=minbase --include=python3.11,python3.11-venv,python3-distutils,python3-lib2to3,python3-pip-whl,python3-setuptools-whl,ca-certificates \
    bookworm "$rootfs" "$(apt_mirror)" >"$cache/debootstrap.log" 2>&1 \
    || { tail -n 20 "$cache/debootstrap.log" >&2; exit 1; }
  # What an image needs no more: package caches, docs, locales, the apt lists.
  rm -rf "$rootfs"/var/cache/apt/* "$rootfs"/var/lib/apt/lists/* "$rootfs"/usr/share/{doc,man,info,locale}/* \
         "$rootfs"/var/log/* "$rootfs"/tmp/*
  # The Dockerfiles call `python`, as the official python images name it.
  ln -sf /usr/bin/python3.11 "$rootfs/usr/local/bin/python"
  ln -sf /usr/bin/python3.11 "$rootfs/usr/local/bin/python3"
  tar --numeric-owner -C "$rootfs" -cf "$tarball.partial" .
  mv "$tarball.partial" "$tarball"
  echo "base image: root filesystem built in $((SECONDS - start))s ($(du -m "$tarball" | cut -f1) MB)" >&2
fi
"$docker" import --change 'ENV LANG=C.UTF-8' --change 'CMD ["python"]' "$tarball" "$ref" >/dev/null
echo "$ref"
