"""Pre-sharded files: each rank's files hold exactly its slice of every split tensor, under the size cap."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file as reference_load_file
from safetensors.torch import save_file
from strata_loader import load_rank
from strata_loader.core.format import parse_file_bytes
from strata_loader.tensor import shard
from strata_loader.tensor.shard import rank_files, shard_dim, shard_directory
from strata_loader.tensor.writer import encode_header, layout


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


def _raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _random(dtype: torch.dtype, shape, gen: torch.Generator) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    bits = torch.randint(0, 2 if dtype == torch.bool else 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    return bits.view(dtype).reshape(shape)


SPLIT_RULES = (("*.d0", 0), ("*.d1", 1), ("*.d2", 2))


@pytest.mark.parametrize("copy_bytes", [1, 24, 1000, 2**20])  # runs one by one, rows gathered, all at once
@pytest.mark.parametrize("tp", [2, 4])
def test_a_split_along_any_dim_is_the_exact_slice_for_every_dtype(tmp_path, monkeypatch, copy_bytes, tp):
    monkeypatch.setattr(shard, "COPY_BYTES", copy_bytes)
    monkeypatch.setattr(shard, "DEFAULT_BLOCK_SIZE", 7)  # larger reads run as parallel 7-byte ones
    gen = torch.Generator().manual_seed(tp)
    dtypes = [
        torch.bfloat16,
        torch.float8_e4m3fn,
        torch.float8_e5m2,
        torch.float16,
        torch.float32,
        torch.float64,
        torch.int8,
        torch.int64,
        torch.bool,
        torch.complex64,
        torch.uint16,
    ]
    full = {}
    for i, dt in enumerate(dtypes):
        full[f"t{i}.d0"] = _random(dt, (4 * tp, 3, 5), gen)
        full[f"t{i}.d1"] = _random(dt, (3, 2 * tp, 5), gen)
        full[f"t{i}.d2"] = _random(dt, (2, 3, tp), gen)
        full[f"t{i}.whole"] = _random(dt, (7, 3), gen)
        full[f"t{i}.empty.d1"] = _random(dt, (0, tp), gen)
    full["odd.d1"] = _random(torch.float32, (4, tp + 1), gen)  # not divisible: replicated
    src = tmp_path / "model"
    src.mkdir()
    names = sorted(full)
    save_file({n: full[n] for n in names[::2]}, src / "a.safetensors")
    save_file({n: full[n] for n in names[1::2]}, src / "b.safetensors")
    files = shard_directory(src, tmp_path / "out", tp=tp, max_part_bytes=700, rules=SPLIT_RULES)
    assert [f.name for f in files] == [
        f"model-rank-{r}-part-{p}.safetensors" for r in range(tp) for p in range(len(files) // tp)
    ]
    for rank in range(tp):
        got = {}
        for f in rank_files(tmp_path / "out", rank):
            got.update(reference_load_file(f))
        assert sorted(got) == names
        for name, t in full.items():
            dim = shard_dim(name, t.shape, tp, SPLIT_RULES)
            want = t if dim is None else torch.chunk(t, tp, dim)[rank] if t.numel() else t.narrow(dim, 0, 1)
            assert (got[name].dtype, got[name].shape) == (want.dtype, want.shape), name
            assert _raw(got[name]) == _raw(want), name


def test_sub_byte_dtypes_split_on_byte_boundaries_or_say_why_not(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    data = bytes(range(12))  # F4 [4, 6]: 3 bytes per row
    placed = layout([("w.d0", "F4", (4, 6))])
    (src / "m.safetensors").write_bytes(encode_header(placed) + data)
    shard_directory(src, tmp_path / "out", tp=2, max_part_bytes=2**20, rules=SPLIT_RULES)
    for rank in range(2):
        buf = (tmp_path / "out" / f"model-rank-{rank}-part-0.safetensors").read_bytes()
        h = parse_file_bytes(buf)
        (t,) = h.tensors
        assert (t.dtype, t.shape) == ("F4", (2, 6))
        assert buf[h.data_offset :] == data[rank * 6 : rank * 6 + 6]
    placed = layout([("w.d1", "F4", (4, 6))])  # half a row is 3 nibbles: no whole bytes
    (src / "m.safetensors").write_bytes(encode_header(placed) + data)
    with pytest.raises(ValueError, match="byte boundary"):
        shard_directory(src, tmp_path / "out2", tp=2, max_part_bytes=2**20, rules=SPLIT_RULES)


def test_output_is_reproducible_and_a_failure_leaves_no_partial_files(tmp_path, monkeypatch):
    gen = torch.Generator().manual_seed(8)
    src = tmp_path / "model"
    src.mkdir()
    save_file(
        {"a.q_proj.weight": torch.randn(8, 8, generator=gen), "b.norm": torch.randn(8, generator=gen)},
        src / "m.safetensors",
    )
    first = [f.read_bytes() for f in shard_directory(src, tmp_path / "one", tp=2, max_part_bytes=100)]
    again = [f.read_bytes() for f in shard_directory(src, tmp_path / "two", tp=2, max_part_bytes=100)]
    assert first == again

    def broken(*args, **kwargs):
        raise OSError("disk on fire")

    monkeypatch.setattr(shard, "_pwrite", broken)
    with pytest.raises(OSError, match="disk on fire"):
        shard_directory(src, tmp_path / "three", tp=2, max_part_bytes=100)
    assert list((tmp_path / "three").iterdir()) == []


def test_a_tensor_in_two_source_files_is_an_error(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    save_file({"w": torch.zeros(2)}, src / "a.safetensors")
    save_file({"w": torch.ones(2)}, src / "b.safetensors")
    with pytest.raises(ValueError, match="'w' is in both"):
        shard_directory(src, tmp_path / "out", tp=2, max_part_bytes=2**20)


def test_a_link_planted_under_a_temporary_name_is_not_written_through(tmp_path):
    src = tmp_path / "model"
    src.mkdir()
    save_file({"w": torch.zeros(2)}, src / "m.safetensors")
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    (out / "model-rank-0-part-0.safetensors.tmp").symlink_to(victim)
    shard_directory(src, out, tp=1, max_part_bytes=2**20)
    assert victim.read_bytes() == b"keep"
    assert sorted(p.name for p in out.iterdir()) == ["model-rank-0-part-0.safetensors"]
    assert torch.equal(reference_load_file(out / "model-rank-0-part-0.safetensors")["w"], torch.zeros(2))
