"""safetensors dtype names to torch, and byte buffers to typed tensors without copying."""

from __future__ import annotations

import torch

from ..core.format import TensorInfo

_NAMES = {
    "F64": "float64",
    "F32": "float32",
    "F16": "float16",
    "BF16": "bfloat16",
    "I64": "int64",
    "I32": "int32",
    "I16": "int16",
    "I8": "int8",
    "U8": "uint8",
    "BOOL": "bool",
    "C64": "complex64",
    "U64": "uint64",
    "U32": "uint32",
    "U16": "uint16",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E4M3FNUZ": "float8_e4m3fnuz",
    "F8_E5M2": "float8_e5m2",
    "F8_E5M2FNUZ": "float8_e5m2fnuz",
    "F8_E8M0": "float8_e8m0fnu",
}


def torch_dtype(dtype: str) -> torch.dtype:
    """The torch dtype for a safetensors dtype name; a clear error when this torch build has none."""
    attr = _NAMES.get(dtype)
    dt = getattr(torch, attr, None) if attr else None
    if not isinstance(dt, torch.dtype):
        raise TypeError(f"dtype {dtype} has no equivalent in torch {torch.__version__}; read its raw bytes")
    return dt


def view_tensor(buf: torch.Tensor, start: int, info: TensorInfo) -> torch.Tensor:
    """Type `info`'s bytes at `buf[start:]` in place; copies only when the bytes are misaligned for the
    dtype."""
    raw = buf[start : start + info.nbytes]
    dt = torch_dtype(info.dtype)
    if raw.storage_offset() % dt.itemsize:
        raw = raw.clone()
    return raw.view(dt).reshape(info.shape)
