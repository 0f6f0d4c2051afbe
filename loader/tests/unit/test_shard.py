"""Pre-sharded files: each rank's files hold exactly its slice of every split tensor, under the size cap."""

import json

import torch
from safetensors import safe_open
from safetensors.torch import load_file as reference_load_file
from safetensors.torch import save_file
from strata_loader import load_rank
from strata_loader.shard import rank_files, shard_dim, shard_directory


def test_default_rules_split_llama_layers():
    assert shard_dim("model.layers.0.self_attn.q_proj.weight", (64, 32), 2) == 0
    assert shard_dim("model.layers.0.mlp.down_proj.weight", (32, 64), 2) == 1
    assert shard_dim("model.norm.weight", (32,), 2) is None
    assert shard_dim("model.layers.0.self_attn.k_proj.weight", (3, 32), 2) is None  # 3 KV rows, 2 ranks


def test_shards_reassemble_to_the_original(tmp_path):
    gen = torch.Generator().manual_seed(5)
    src = tmp_path / "model"
    src.mkdir()
    full = {
        "model.embed_tokens.weight": torch.randn(64, 16, generator=gen).to(torch.bfloat16),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(16, 16, generator=gen),
        "model.layers.0.self_attn.o_proj.weight": torch.randn(16, 16, generator=gen),
        "model.layers.0.mlp.down_proj.weight": torch.randn(16, 32, generator=gen),
        "model.norm.weight": torch.randn(16, generator=gen),
    }
    save_file(dict(list(full.items())[:3]), src / "model-00001-of-00002.safetensors")
    save_file(dict(list(full.items())[3:]), src / "model-00002-of-00002.safetensors")
    out = tmp_path / "sharded"
    cap = 1500
    files = shard_directory(src, out, tp=2, max_part_bytes=cap)
    assert {f.name for f in files} >= {"model-rank-0-part-0.safetensors", "model-rank-1-part-0.safetensors"}
    for f in files:
        if len(reference_load_file(f)) > 1:
            assert sum(t.numel() * t.element_size() for t in reference_load_file(f).values()) <= cap
    ranks = [load_rank(out, r) for r in range(2)]
    for name, t in full.items():
        dim = shard_dim(name, t.shape, 2)
        if dim is None:
            assert all(torch.equal(r[name], t) for r in ranks)
        else:
            assert torch.equal(torch.cat([r[name] for r in ranks], dim=dim), t)
    assert len(rank_files(out, 0)) >= 2


def test_metadata_names_the_split_dims_of_the_tensors_in_its_own_file(tmp_path):
    gen = torch.Generator().manual_seed(6)
    src = tmp_path / "model"
    src.mkdir()
    full = {
        "model.embed_tokens.weight": torch.randn(8, 4, generator=gen),
        "model.layers.0.mlp.down_proj.weight": torch.randn(4, 8, generator=gen),
        "model.layers.0.self_attn.q_proj.weight": torch.randn(8, 4, generator=gen),
        "model.norm.weight": torch.randn(4, generator=gen),
    }
    save_file(full, src / "model.safetensors")
    files = shard_directory(src, tmp_path / "out", tp=2, max_part_bytes=1)  # one tensor per part
    assert len(files) == 2 * len(full)
    for f in files:
        with safe_open(f, "pt") as sf:
            meta, names = sf.metadata(), list(sf.keys())
        assert len(names) == 1
        want = {n: d for n in names if (d := shard_dim(n, full[n].shape, 2)) is not None}
        assert json.loads(meta.pop("strata.shard_dims")) == want, f.name
        assert meta == {"format": "pt", "strata.tp_size": "2", "strata.rank": f.name.split("-")[2]}
