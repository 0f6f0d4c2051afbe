"""The torch-free safetensors writer lays files out as the reference writer does, byte for byte."""

import pytest
import torch
from safetensors.torch import save
from strata_loader.core.format import DTYPE_BITS, parse_file_bytes
from strata_loader.tensor.writer import DTYPE_ORDER, encode_header, layout

DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
    "C64": torch.complex64,
    "U16": torch.uint16,
    "U32": torch.uint32,
    "U64": torch.uint64,
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "F8_E4M3FNUZ": torch.float8_e4m3fnuz,
    "F8_E5M2FNUZ": torch.float8_e5m2fnuz,
}


def raw(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""


def write(tensors: dict[str, torch.Tensor], dtypes: dict[str, str], metadata=None) -> bytes:
    placed = layout((name, dtypes[name], tuple(t.shape)) for name, t in tensors.items())
    return encode_header(placed, metadata) + b"".join(raw(tensors[p.name]) for p in placed)


def test_every_dtype_parses_the_reference_would_place():
    assert sorted(DTYPE_ORDER) == sorted(DTYPE_BITS)


@pytest.mark.parametrize("metadata", [None, {"format": "pt"}, {"k": "x" * 13}])
def test_bytes_equal_the_reference_writers(metadata):
    gen = torch.Generator().manual_seed(2)
    tensors, dtypes = {}, {}
    for i, (st, dt) in enumerate(DTYPES.items()):
        for kind, shape in (("matrix", (3, 5 + i)), ("scalar", ()), ("empty", (0, 2)), ("vector", (i + 1,))):
            n = 1
            for d in shape:
                n *= d
            bits = torch.randint(0, 256, (n * dt.itemsize,), dtype=torch.uint8, generator=gen)
            name = f"{kind}.{st.lower()}"
            tensors[name] = bits.view(dt).reshape(shape) if n else torch.empty(shape, dtype=dt)
            dtypes[name] = st
    tensors['naïve/\x01"name'] = torch.ones(3)
    dtypes['naïve/\x01"name'] = "F32"
    # one key at most: the reference writes several in a per-process hash order
    assert write(tensors, dtypes, metadata) == save(tensors, metadata=metadata)


def test_header_is_padded_to_8_and_valid_for_the_strict_parser():
    placed = layout([("w4", "F4", (4, 6)), ("b", "BOOL", (3,)), ("w", "BF16", (2, 3)), ("x", "F6_E2M3", (4,))])
    assert [p.name for p in placed] == ["w", "x", "w4", "b"]
    meta = {"z": "1", "a": "2", "m": "é"}
    for extra in range(8):
        header = encode_header(placed, {**meta, "pad": "p" * extra})
        assert len(header) % 8 == 0
        parsed = parse_file_bytes(header + bytes(placed[-1].end))
        assert list(parsed.metadata) == ["z", "a", "m", "pad"]  # the caller's order, reproducibly
        assert [(t.name, t.dtype, t.shape, t.start, t.end) for t in parsed.tensors] == [
            (p.name, p.dtype, p.shape, p.start, p.end) for p in placed
        ]


def test_rejects_what_no_reader_could_load():
    with pytest.raises(ValueError, match="whole number of bytes"):
        layout([("w", "F4", (3,))])
    with pytest.raises(ValueError, match="reserved"):
        encode_header(layout([("__metadata__", "F32", (1,))]))
    with pytest.raises(ValueError, match="unique"):
        encode_header(layout([("w", "F32", (1,)), ("w", "F16", (1,))]))
