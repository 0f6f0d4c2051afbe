"""`--load-format strata` inside real vLLM 0.33 (CPU): vLLM's own `get_model_loader` builds a tiny Llama from
safetensors files written here, and every parameter must equal what vLLM's own safetensors loader makes of the
same files, bit for bit.

vLLM runs in its own virtualenv (strata_testsupport.vllm); `loader_engine.py` is the vLLM side. vLLM finds the
plugin through the `vllm.general_plugins` entry point, as after `pip install strata`, without touching the cached
venv (strata_testsupport.vllm_loader).
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from strata_loader.tensor.shard import shard_directory
from strata_testsupport.vllm import VLLM_VERSIONS, VllmScript
from strata_testsupport.vllm_loader import CONFIG, llama_weights, loader_script, write_model

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=sorted(VLLM_VERSIONS))
def vllm_loader(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmScript]:
    """One vLLM-side process for the module (vLLM imports once), for each vLLM version Strata supports."""
    requirements = VLLM_VERSIONS[request.param]
    script = loader_script(tmp_path_factory.mktemp("site"), tmp_path_factory.mktemp("vllm-loader"), requirements)
    try:
        yield script
    finally:
        script.close()


def test_vllm_finds_the_loader_through_the_entry_point(vllm_loader: VllmScript) -> None:
    answer = vllm_loader.call({"mode": "plugins"})
    assert answer["entry_points"]["strata"] == "strata_loader.vllm.plugin:register"
    assert answer["loader_class"] == "strata_loader.vllm.plugin.StrataModelLoader"


def test_vllm_plugins_filters_by_the_entry_point_name(vllm_loader: VllmScript) -> None:
    """What loader/README.md tells users: keep `strata` in `VLLM_PLUGINS` when it is set."""
    answer = vllm_loader.call({"mode": "filtered", "values": ["strata", "another_plugin"]})
    assert answer["registered"] == {"strata": True, "another_plugin": False}


def test_a_tiny_llama_loads_bit_exact(vllm_loader: VllmScript, tmp_path: Path) -> None:
    model = write_model(tmp_path / "model")
    answer = vllm_loader.call(
        {"mode": "load", "model_dir": str(model), "reference_dir": str(model), "extra": {"concurrency": 2}}
    )
    (rank,) = answer["ranks"]
    assert rank["loader_class"] == "strata_loader.vllm.plugin.StrataModelLoader"
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
