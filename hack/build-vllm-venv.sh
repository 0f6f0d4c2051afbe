#!/usr/bin/env bash
# Builds vLLM's own virtualenv (pinned in hack/vllm/requirements.txt) into a cache outside the repo, once, for the
# tests and the bench that run vLLM's code on CPU. Prints the venv's python on its last line. The cache key is the
# vLLM version plus a hash of the requirements file, so editing the pins builds a new venv next to the old one.
# Re-running with the venv complete does nothing. STRATA_VLLM_PYTHON (an existing python with vllm) skips the build.
# First build: ~9.4 GB (torch and its nvidia wheels) and about 5-6 minutes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="$here/vllm/requirements.txt"
python="${PYTHON:-python3}"

if [[ -n "${STRATA_VLLM_PYTHON:-}" && -x "${STRATA_VLLM_PYTHON}" ]]; then
  echo "vllm venv: using STRATA_VLLM_PYTHON=${STRATA_VLLM_PYTHON}" >&2
  echo "$STRATA_VLLM_PYTHON"
  exit 0
fi

vllm_version="$(awk -F'==' '$1=="vllm" {print $2}' "$req")"
req_hash="$(sha256sum "$req" | cut -c1-12)"
venv="${XDG_CACHE_HOME:-$HOME/.cache}/strata/venvs/vllm-${vllm_version}-${req_hash}"

# A venv is not relocatable (its scripts name their interpreter by absolute path), so it is built in place and
# counts as complete only once the stamp is written; a half-built one from an interrupted run is started over.
# Two test processes starting at once (CI's and a developer's own run) build it once: the second waits here, then
# finds it complete. Without the lock each removed what the other was installing.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [[ ! -f "$venv/.installed" ]]; then
  rm -rf "$venv"
  echo "vllm venv: installing vllm ${vllm_version} into $venv (first time only; ~9 GB, several minutes)" >&2
  start=$SECONDS
  "$python" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  # VLLM_TARGET_DEVICE=cpu matters for any source build pip might fall back to; the PyPI wheel runs on CPU as is.
  VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -m pip install --quiet -r "$req"
  VLLM_TARGET_DEVICE=cpu "$venv/bin/python" -c "import vllm, sys; sys.stderr.write('vllm venv: vllm ' + vllm.__version__ + '\n')"
  touch "$venv/.installed"
  echo "vllm venv: built in $((SECONDS - start))s" >&2
fi
echo "$venv/bin/python"
