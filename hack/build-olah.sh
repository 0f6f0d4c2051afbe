#!/usr/bin/env bash
# Builds a venv holding olah (a real, self-hosted Hugging Face Hub server; pinned in hack/olah/requirements.txt) in
# a cache outside the repo, once, for the hf:// tests. Its own venv because its dependencies conflict with the dev
# venv's (fastapi-utils pins psutil<6). Prints the venv's python on its last line; re-running with it present (and
# the same requirements) does nothing. OLAH_PYTHON (a python that can `import olah`) skips the build.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="$here/olah/requirements.txt"
tag="$(sha256sum "$req" | cut -c1-12)"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/strata/olah-venv-${tag}"

if [[ -n "${OLAH_PYTHON:-}" && -x "${OLAH_PYTHON}" ]]; then
  echo "olah: using OLAH_PYTHON=${OLAH_PYTHON}" >&2
  echo "$OLAH_PYTHON"
  exit 0
fi

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9  # two test processes starting at once build it once
if [[ ! -f "$venv/.installed" ]]; then
  echo "olah: installing into $venv (first time only; about a minute)" >&2
  rm -rf "$venv.partial"
  "${PYTHON:-python3}" -m venv "$venv.partial"
  "$venv.partial/bin/python" -m pip install --quiet --upgrade pip
  "$venv.partial/bin/python" -m pip install --quiet -r "$req"
  touch "$venv.partial/.installed"
  rm -rf "$venv"
  mv "$venv.partial" "$venv"
fi
echo "$venv/bin/python"
