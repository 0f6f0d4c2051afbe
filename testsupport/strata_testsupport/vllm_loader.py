"""A tiny Llama on disk and a vLLM-side process that sees `--load-format strata` through its entry point: shared by
loader/tests/vllm and bench/vllm_loader.py.

The plugin is found as after `pip install strata`, through the `vllm.general_plugins` entry point, without
touching the cached vLLM venv: a dist-info holding the entry points pyproject.toml declares is put on the
subprocess's path next to the repo's sources (strata_loader needs strata_units; torch and numpy are vLLM's).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from strata_testsupport.vllm import REPO, VLLM_REQUIREMENTS, VllmScript

ENGINE = REPO / "loader" / "tests" / "vllm" / "loader_engine.py"

CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "num_hidden_layers": 2,
    "vocab_size": 256,
    "max_position_embeddings": 256,
    "torch_dtype": "float32",
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
}


def llama_weights(config: dict[str, Any], seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights under the checkpoint names a Hugging Face Llama has (unfused q/k/v, gate/up)."""
    g = torch.Generator().manual_seed(seed)
    h, i, v, d = config["hidden_size"], config["intermediate_size"], config["vocab_size"], config["head_dim"]
    kv = config["num_key_value_heads"] * d
    shapes = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for n in range(config["num_hidden_layers"]):
        p = f"model.layers.{n}."
        shapes |= {
            p + "self_attn.q_proj.weight": (config["num_attention_heads"] * d, h),
            p + "self_attn.k_proj.weight": (kv, h),
            p + "self_attn.v_proj.weight": (kv, h),
            p + "self_attn.o_proj.weight": (h, config["num_attention_heads"] * d),
            p + "mlp.gate_proj.weight": (i, h),
            p + "mlp.up_proj.weight": (i, h),
            p + "mlp.down_proj.weight": (h, i),
            p + "input_layernorm.weight": (h,),
            p + "post_attention_layernorm.weight": (h,),
        }
    return {k: torch.randn(s, generator=g, dtype=torch.float32) for k, s in shapes.items()}


def write_model(path: Path, config: dict[str, Any] = CONFIG, seed: int = 0) -> Path:
    """config.json plus the weights in two files, as a sharded checkpoint (and a ModelCache) holds them."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    weights = llama_weights(config, seed)
    names = sorted(weights)
    half = len(names) // 2
    for n, part in enumerate((names[:half], names[half:])):
        save_file({k: weights[k] for k in part}, str(path / f"model-0000{n + 1}-of-00002.safetensors"))
    return path


def plugin_dist_info(site: Path) -> Path:
    """A `strata` dist-info whose entry_points.txt is pyproject.toml's entry-point tables: what `pip install
    strata` writes, without installing anything into the cached vLLM venv."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    info = site / f"strata-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: strata\nVersion: {project['version']}\n")
    groups = project["entry-points"]
    (info / "entry_points.txt").write_text(
        "".join(f"[{g}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n" for g, eps in groups.items())
    )
    return site


def loader_script(site: Path, log_dir: Path, requirements: Path = VLLM_REQUIREMENTS) -> VllmScript:
    """The vLLM side (`loader_engine.py`) in the venv `requirements` builds, with the dist-info written into
    `site` and the repo on its path."""
    plugin_dist_info(site)
    path = ":".join(str(p) for p in (site, REPO / "loader", REPO / "units", REPO / "kvserver"))
    return VllmScript(ENGINE, log_dir, env={"PYTHONPATH": path}, requirements=requirements)
