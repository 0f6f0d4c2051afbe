"""What an engine's log says about its start and its compile: read the same way for a pod on the real node
(`bench/realnode_compile.py`, `bench/compile_start.py`) and a process on a GPU machine (`bench/gpu_vllm.sh
--compile-start`). Standard library only: the GPU bench's driver runs in a venv without the cluster's packages.
"""

from __future__ import annotations

import re

TORCH_CACHE_LOGS = "torch._inductor.codecache,torch._functorch._aot_autograd.autograd_cache"
"""TORCH_LOGS that turn on, at INFO, the two torch modules whose `... cache hit for key` and `... cache miss for key`
lines say whether a compile was served from the cache: vLLM on CPU compiles with stock torch.compile
(`DYNAMO_TRACE_ONCE`) and logs nothing of its own about it. Not a part of the compile key (vLLM's key covers its own
VLLM_* variables only), so the cold and the warm engine share a key with it as without it."""

INIT_ENGINE = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([0-9.]+) s")
"""vLLM's engine core, once per start (vllm/v1/engine/core.py): model loaded to warmed up, compile included."""

COMPILE_LINES = {
    "fx_graph_hit": "fx graph cache hit for key",
    "fx_graph_miss": "fx graph cache miss for key",
    "aot_autograd_hit": "AOTAutograd cache hit for key",
    "aot_autograd_miss": "AOTAutograd cache miss for key",
    "vllm_loaded": "Directly load the compiled graph(s)",
    "vllm_compiled": "Compiling a graph for compile range",
}
"""Counted per log: torch's (inductor's FX graph cache, AOTAutograd's cache; needs TORCH_CACHE_LOGS) and vLLM's own
compiler's (GPUs: `VLLM_COMPILE`), whose graphs are loaded from its cache or compiled."""


def init_engine_seconds(log: str) -> float | None:
    """vLLM's `init engine (profile, create kv cache, warmup model) took X s`, None when the log has none."""
    found = INIT_ENGINE.search(log)
    return float(found[1]) if found else None


def compile_line_counts(log: str) -> dict[str, int]:
    """How many of each `COMPILE_LINES` line the log holds."""
    return {name: log.count(text) for name, text in COMPILE_LINES.items()}
