"""`--load-format strata` over S3 (a real S3 server): a rank's pre-sharded parts are found by listing, and the
tensors it streams are that rank's. The streaming itself is strata_loader's (`iter_tensors` over S3 readers),
tested with its own integration tests; vLLM's side is in loader/tests/vllm (local files)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from strata_loader.tensor.api import iter_tensors
from strata_loader.tensor.shard import shard_directory
from strata_loader.vllm.serving import LoaderOptions, select_files

pytestmark = pytest.mark.integration


def test_a_rank_lists_and_streams_its_parts_from_s3(s3_env, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    src = tmp_path / "m"
    src.mkdir()
    weights = {"model.layers.0.mlp.down_proj.weight": torch.arange(64, dtype=torch.float32).reshape(4, 16)}
    save_file(weights, str(src / "model.safetensors"))
    shard_directory(src, src / "sharded", 2, max_part_bytes=2**20)
    bucket = s3_env.create_bucket()
    client = s3_env.client()
    for f in [src / "model.safetensors", *sorted((src / "sharded").iterdir())]:
        client.upload_file(str(f), bucket, f"models/llama/{f.relative_to(src)}")
    source = LoaderOptions().resolve_source(f"s3://{bucket}/models/llama/")
    chosen = select_files(source, LoaderOptions(), 1, 2)
    assert chosen.presharded
    assert chosen.files == [f"s3://{bucket}/models/llama/sharded/model-rank-1-part-0.safetensors"]
    got = dict(iter_tensors(chosen.files))
    expected = load_file(str(src / "sharded" / "model-rank-1-part-0.safetensors"))
    assert got.keys() == expected.keys()
    assert torch.equal(
        got["model.layers.0.mlp.down_proj.weight"], weights["model.layers.0.mlp.down_proj.weight"][:, 8:]
    )
    whole = select_files(source, LoaderOptions(sharded="never"), 1, 2)
    assert whole.files == [f"s3://{bucket}/models/llama/model.safetensors"]
