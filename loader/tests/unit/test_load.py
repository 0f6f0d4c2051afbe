"""The streamer returns exactly what safetensors returns: same names, order, dtypes, shapes and bits."""

import os
import struct

import pytest
import strata_loader
import torch
from safetensors.torch import load_file as reference_load_file
from safetensors.torch import save_file
from strata_loader import SafetensorsError

DTYPES = [
    torch.float64,
    torch.float32,
    torch.float16,
    torch.bfloat16,
    torch.int64,
    torch.int32,
    torch.int16,
    torch.int8,
    torch.uint8,
    torch.bool,
    torch.complex64,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2fnuz,
]


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def assert_same(got: dict, want: dict) -> None:
    assert list(got) == list(want)
    for k in want:
        assert got[k].dtype == want[k].dtype, k
        assert got[k].shape == want[k].shape, k
        assert raw(got[k]) == raw(want[k]), k


def random_tensor(dtype: torch.dtype, shape, gen: torch.Generator) -> torch.Tensor:
    n = 1
    for d in shape:
        n *= d
    bits = torch.randint(0, 256, (n * dtype.itemsize,), dtype=torch.uint8, generator=gen)
    return bits.view(dtype).reshape(shape) if n else torch.empty(shape, dtype=dtype)


@pytest.fixture
def every_dtype_file(tmp_path):
    gen = torch.Generator().manual_seed(1)
    tensors = {}
    for i, dt in enumerate(DTYPES):
        name = str(dt).removeprefix("torch.")
        tensors[f"{name}.matrix"] = random_tensor(dt, (7, 13 + i), gen)
        tensors[f"{name}.scalar"] = random_tensor(dt, (), gen)
        tensors[f"{name}.empty"] = random_tensor(dt, (0, 3), gen)
    path = tmp_path / "all.safetensors"
    save_file(tensors, path, metadata={"format": "pt"})
    return path


def test_every_dtype_scalar_and_empty_is_bit_exact(every_dtype_file):
    assert_same(strata_loader.load_file(every_dtype_file), reference_load_file(every_dtype_file))


def test_results_stay_valid_after_more_loads(every_dtype_file, tmp_path):
    first = strata_loader.load_file(every_dtype_file)
    snapshot = {k: raw(v) for k, v in first.items()}
    other = tmp_path / "other.safetensors"
    save_file({"x": torch.full((1000,), 7.0)}, other)
    for _ in range(3):
        strata_loader.load_file(other)
    assert {k: raw(v) for k, v in first.items()} == snapshot


def test_many_files_at_once(tmp_path):
    gen = torch.Generator().manual_seed(2)
    paths, want = [], {}
    for i in range(12):
        part = {f"layer{i}.w{j}": random_tensor(torch.bfloat16, (64, 48 + j), gen) for j in range(5)}
        p = tmp_path / f"model-{i:05d}-of-00012.safetensors"
        save_file(part, p)
        paths.append(p)
        want.update(reference_load_file(p))
    got = strata_loader.load_files(paths, concurrency=4, block_size=4096)
    assert_same(got, want)


@pytest.mark.parametrize("copy", [True, False])
def test_iterator_yields_every_tensor_bit_exact(tmp_path, every_dtype_file, copy):
    want = reference_load_file(every_dtype_file)
    got = {}
    for name, t in strata_loader.iter_tensors(
        [every_dtype_file], copy=copy, batch_bytes=512, memory_limit=2048, block_size=256
    ):
        got[name] = raw(t)  # copy=False: bytes taken before the next item, as the lifetime rule says
    assert got == {k: raw(v) for k, v in want.items()}


def test_iterator_copies_are_safe_to_keep(tmp_path):
    gen = torch.Generator().manual_seed(3)
    tensors = {f"t{i}": random_tensor(torch.float32, (256,), gen) for i in range(64)}
    p = tmp_path / "m.safetensors"
    save_file(tensors, p)
    kept = dict(strata_loader.iter_tensors([p], copy=True, batch_bytes=2048, memory_limit=4096))
    assert {k: raw(v) for k, v in kept.items()} == {k: raw(v) for k, v in tensors.items()}


def test_misaligned_tensor_is_still_correct(tmp_path):
    # a hand-written file whose F32 tensor starts at an odd offset: views must not be misaligned
    header = (
        b'{"a":{"dtype":"U8","shape":[3],"data_offsets":[0,3]},"b":{"dtype":"F32","shape":[2],"data_offsets":[3,11]}}'
    )
    data = bytes([1, 2, 3]) + struct.pack("<2f", 1.5, -2.0)
    p = tmp_path / "odd.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header + data)
    got = strata_loader.load_file(p)
    assert got["b"].tolist() == [1.5, -2.0]
    assert_same(got, reference_load_file(p))


@pytest.fixture
def matrix_file(tmp_path):
    gen = torch.Generator().manual_seed(4)
    t = {"w": random_tensor(torch.bfloat16, (40, 24, 6), gen), "v": random_tensor(torch.float32, (33, 17), gen)}
    p = tmp_path / "m.safetensors"
    save_file(t, p)
    return p, t


@pytest.mark.parametrize(
    "index",
    [
        (slice(3, 9),),
        (slice(None), slice(5, 12)),
        (slice(2, 30), slice(0, 24), slice(1, 4)),
        (5,),
        (Ellipsis, 2),
        (slice(-5, None), -1),
        (slice(10, 10),),
        (slice(0, 40), slice(23, 99)),
    ],
)
def test_slice_equals_slicing_the_full_tensor(matrix_file, index):
    p, t = matrix_file
    with strata_loader.SafetensorsFile(p) as f:
        got = f.get_slice("w")[index]
    want = t["w"][index]
    assert got.shape == want.shape and raw(got) == raw(want)


@pytest.mark.parametrize("dim", [0, 1])
@pytest.mark.parametrize("world", [1, 3])
def test_rank_shards_equal_chunks_of_the_tensor(matrix_file, dim, world):
    p, t = matrix_file
    name = "v"  # 33 x 17: dim 0 splits 3 ways, dim 1 does not
    with strata_loader.SafetensorsFile(p) as f:
        for rank in range(world):
            if t[name].shape[dim] % world:
                with pytest.raises(ValueError, match="not divisible"):
                    f.shard(name, dim, rank, world)
                continue
            want = torch.chunk(t[name], world, dim=dim)[rank]
            assert raw(f.shard(name, dim, rank, world)) == raw(want)


def test_truncated_file_is_a_clear_error(matrix_file, tmp_path):
    p, _ = matrix_file
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(SafetensorsError, match="truncated"):
        strata_loader.load_file(cut)


def test_file_that_shrinks_after_the_header_is_read_is_a_clear_error(matrix_file, tmp_path):
    p, _ = matrix_file
    f = strata_loader.SafetensorsFile(p)
    size = os.path.getsize(p)
    os.truncate(p, size - 100)
    with pytest.raises(SafetensorsError, match="ended at byte"):
        f.get_tensor(max(f.keys(), key=lambda n: f.info(n).end))  # the tensor that lost its tail
    f.close()


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such file"):
        strata_loader.load_file(tmp_path / "nope.safetensors")
