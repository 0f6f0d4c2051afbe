"""`--load-format strata` inside real vLLM 0.33 (CPU): vLLM's own `get_model_loader` builds a tiny Llama from
safetensors files written here, and every parameter must equal what vLLM's own safetensors loader makes of the
same files, bit for bit.

vLLM runs in its own virtualenv (strata_testsupport.vllm); `loader_engine.py` is the vLLM side. vLLM finds the
plugin through the `vllm.general_plugins` entry point, as after `pip install strata`: the cached venv is never
modified; instead a dist-info holding the entry points pyproject.toml declares is put on the subprocess's path
next to the repo's sources.
"""

from __future__ import annotations

import json
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file
from strata_loader.shard import shard_directory
from strata_testsupport.vllm import REPO, VllmScript

pytestmark = pytest.mark.integration

ENGINE = Path(__file__).with_name("loader_engine.py")

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


def write_model(path: Path, config: dict[str, Any] = CONFIG) -> Path:
    """config.json plus the weights in two files, as a sharded checkpoint (and a ModelCache) holds them."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    weights = llama_weights(config)
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


@pytest.fixture(scope="module")
def vllm_loader(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmScript]:
    """One vLLM-side process for the module; the repo's packages and the dist-info on its path."""
    site = plugin_dist_info(tmp_path_factory.mktemp("site"))
    path = ":".join(str(p) for p in (site, REPO / "loader", REPO / "units", REPO / "kvserver"))
    script = VllmScript(ENGINE, tmp_path_factory.mktemp("vllm-loader"), env={"PYTHONPATH": path})
    try:
        yield script
    finally:
        script.close()


def test_vllm_finds_the_loader_through_the_entry_point(vllm_loader: VllmScript) -> None:
    answer = vllm_loader.call({"mode": "plugins"})
    assert answer["entry_points"]["strata"] == "strata_loader.vllm_plugin:register"
    assert answer["loader_class"] == "strata_loader.vllm_plugin.StrataModelLoader"


def test_a_tiny_llama_loads_bit_exact(vllm_loader: VllmScript, tmp_path: Path) -> None:
    model = write_model(tmp_path / "model")
    answer = vllm_loader.call(
        {"mode": "load", "model_dir": str(model), "reference_dir": str(model), "extra": {"concurrency": 2}}
    )
    (rank,) = answer["ranks"]
    assert rank["loader_class"] == "strata_loader.vllm_plugin.StrataModelLoader"
    assert rank["params"] > 0 and rank["differ"] == []
    assert rank["file_compared"] >= 2 * CONFIG["num_hidden_layers"] + 2 and rank["file_differ"] == []
    stats = rank["stats"]
    assert stats["presharded"] is False
    assert sorted(Path(f).name for f in stats["files"]) == sorted(p.name for p in model.glob("*.safetensors"))
    assert stats["tensors"] == len(llama_weights(CONFIG))


def test_the_source_option_points_at_the_files(vllm_loader: VllmScript, tmp_path: Path) -> None:
    """`--model` names a config-only directory (or a hub id); the weights are where the ModelCache is mounted."""
    weights = write_model(tmp_path / "cache")
    config_only = tmp_path / "config"
    config_only.mkdir()
    shutil.copy(weights / "config.json", config_only / "config.json")
    answer = vllm_loader.call(
        {
            "mode": "load",
            "model_dir": str(config_only),
            "reference_dir": str(weights),
            "extra": {"source": str(weights)},
        }
    )
    (rank,) = answer["ranks"]
    assert rank["differ"] == [] and rank["stats"]["tensors"] == len(llama_weights(CONFIG))


def corrupt(path: Path) -> None:
    """Same name and size, not a safetensors file: reading any of it fails loudly."""
    path.write_bytes(b"\xff" * path.stat().st_size)


def test_each_rank_reads_only_its_presharded_parts(vllm_loader: VllmScript, tmp_path: Path) -> None:
    """Tensor parallel 2, one process per rank. Each rank gets its own copy of the ModelCache in which every
    file except its own parts (the whole checkpoint and the other rank's parts) is garbage: the load succeeds
    only if it reads nothing else, and it must still equal vLLM's own loader reading the whole checkpoint."""
    reference = write_model(tmp_path / "reference")
    shard_directory(reference, reference / "sharded", 2, max_part_bytes=64 * 1024)
    dirs = []
    for rank in range(2):
        d = tmp_path / f"rank{rank}"
        shutil.copytree(reference, d)
        for f in [*d.glob("*.safetensors"), *(d / "sharded").glob("*.safetensors")]:
            if not f.name.startswith(f"model-rank-{rank}-"):
                corrupt(f)
        dirs.append(d)
    answer = vllm_loader.call(
        {
            "mode": "load",
            "tp_size": 2,
            "model_dirs": [str(d) for d in dirs],
            "reference_dir": str(reference),
            "workdir": str(tmp_path),
        }
    )
    for rank, result in enumerate(answer["ranks"]):
        assert result["differ"] == [], f"rank {rank}"
        stats = result["stats"]
        assert stats["presharded"] is True
        parts = sorted((dirs[rank] / "sharded").glob(f"model-rank-{rank}-part-*.safetensors"))
        assert len(parts) > 1 and sorted(stats["files"]) == sorted(str(p) for p in parts)


def test_an_unknown_option_is_one_clear_error(vllm_loader: VllmScript, tmp_path: Path) -> None:
    model = write_model(tmp_path / "model")
    answer = vllm_loader.call({"mode": "error", "model_dir": str(model), "extra": {"concurency": 8}})
    assert answer["raised"] == "ValueError"
    assert "unknown key(s) ['concurency']" in answer["message"] and "'concurrency'" in answer["message"]


def test_a_missing_directory_is_one_clear_error(vllm_loader: VllmScript, tmp_path: Path) -> None:
    model = write_model(tmp_path / "model")
    missing = tmp_path / "not-mounted"
    answer = vllm_loader.call({"mode": "error", "model_dir": str(model), "extra": {"source": str(missing)}})
    assert answer["raised"] == "FileNotFoundError"
    assert f"model directory {missing} does not exist" in answer["message"]
