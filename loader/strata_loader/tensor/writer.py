"""Writing safetensors headers without torch or the `safetensors` package: layout and header bytes, pure.

The layout matches the reference writer's (`safetensors.torch.save_file`): tensors sorted by dtype, widest
first, then by name, so every tensor starts at an offset aligned to its element size; the JSON header is
compact, `__metadata__` first, and padded with spaces to a multiple of 8 bytes. Given the same tensors and no
metadata (or one key), the bytes are identical to the reference's. Metadata keys keep the caller's order,
where the reference writes them in a per-process hash order.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterable, Mapping, Sequence

from ..core.format import DTYPE_BITS, METADATA_KEY, TensorInfo

DTYPE_ORDER: tuple[str, ...] = (
    "BOOL",
    "F4",
    "F6_E2M3",
    "F6_E3M2",
    "U8",
    "I8",
    "F8_E5M2",
    "F8_E4M3",
    "F8_E8M0",
    "F8_E4M3FNUZ",
    "F8_E5M2FNUZ",
    "I16",
    "U16",
    "F16",
    "BF16",
    "I32",
    "U32",
    "F32",
    "C64",
    "F64",
    "I64",
    "U64",
)
"""The reference's dtype order, narrowest first; files hold tensors in the reverse of it."""

_RANK = {name: i for i, name in enumerate(DTYPE_ORDER)}


def tensor_nbytes(dtype: str, shape: Sequence[int]) -> int:
    bits = math.prod(shape) * DTYPE_BITS[dtype]
    if bits % 8:
        raise ValueError(f"{dtype} x {math.prod(shape)} elements is not a whole number of bytes")
    return bits // 8


def layout(tensors: Iterable[tuple[str, str, Sequence[int]]]) -> list[TensorInfo]:
    """Place (name, dtype, shape) entries in the data section, in the order the reference writes them."""
    entries = sorted(tensors, key=lambda t: (-_RANK[t[1]], t[0]))
    out: list[TensorInfo] = []
    pos = 0
    for name, dtype, shape in entries:
        n = tensor_nbytes(dtype, shape)
        out.append(TensorInfo(name, dtype, tuple(shape), pos, pos + n))
        pos += n
    return out


def encode_header(placed: Sequence[TensorInfo], metadata: Mapping[str, str] | None = None) -> bytes:
    """The 8-byte little-endian length followed by the padded JSON header: everything before the data."""
    names = [p.name for p in placed]
    if len(set(names)) != len(names):
        raise ValueError("tensor names in one file must be unique")
    doc: dict[str, object] = {}
    if metadata is not None:
        doc[METADATA_KEY] = dict(metadata)
    for p in placed:
        if p.name == METADATA_KEY:
            raise ValueError(f"{METADATA_KEY!r} is reserved and cannot name a tensor")
        doc[p.name] = {"dtype": p.dtype, "shape": list(p.shape), "data_offsets": [p.start, p.end]}
    text = json.dumps(doc, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text
