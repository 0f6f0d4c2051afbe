"""Strict, pure safetensors header parsing: bytes in, a validated `Header` out, no I/O.

Kept apart from reading so it can be fuzzed fast. The rules follow the reference implementation (the Rust
`safetensors` crate) and reject anything it would, plus duplicate names and non-finite JSON numbers. Every
error says what is wrong; nothing here allocates in proportion to a size the file claims.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from typing import Any

MAX_HEADER_SIZE = 100_000_000
"""The reference refuses larger headers; so do we, before reading them."""

METADATA_KEY = "__metadata__"

DTYPE_BITS: dict[str, int] = {
    "BOOL": 8,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "I64": 64,
    "U64": 64,
    "F64": 64,
    "C64": 64,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}


class SafetensorsError(ValueError):
    """A file that is not a valid safetensors file; the message names the problem."""


@dataclass(frozen=True, slots=True)
class TensorInfo:
    """One tensor's entry; `start`/`end` are relative to the start of the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True, slots=True)
class Header:
    """A validated header. `tensors` are in data-offset order, which is the order reads should follow."""

    header_size: int
    tensors: tuple[TensorInfo, ...]
    metadata: dict[str, str] | None
    file_size: int

    @property
    def data_offset(self) -> int:
        """Absolute file offset of the data section."""
        return 8 + self.header_size

    def by_name(self) -> dict[str, TensorInfo]:
        return {t.name: t for t in self.tensors}


def parse_header_size(prefix: bytes, file_size: int) -> int:
    """Validate the 8-byte little-endian header length against limits and the file size."""
    if file_size < 8 or len(prefix) < 8:
        raise SafetensorsError(f"file is {file_size} bytes, too small for the 8-byte header length")
    (n,) = struct.unpack("<Q", prefix[:8])
    if n > MAX_HEADER_SIZE:
        raise SafetensorsError(f"header length {n} exceeds the {MAX_HEADER_SIZE}-byte limit")
    if 8 + n > file_size:
        raise SafetensorsError(f"header length {n} exceeds the file ({file_size} bytes)")
    return n


def parse_header(header: bytes, file_size: int) -> Header:
    """Parse and validate the JSON header (the `header_size` bytes after the length prefix)."""
    n = len(header)
    if 8 + n > file_size:
        raise SafetensorsError(f"header length {n} exceeds the file ({file_size} bytes)")
    try:
        text = header.decode("utf-8")
    except UnicodeDecodeError as e:
        raise SafetensorsError(f"header is not valid UTF-8 at byte {e.start}") from None
    if not text.startswith("{"):
        raise SafetensorsError("header does not start with '{'; not a safetensors JSON header")
    try:
        raw = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constants)
    except SafetensorsError:
        raise
    except (ValueError, RecursionError) as e:
        raise SafetensorsError(f"header is not valid JSON: {str(e)[:200]}") from None
    if not isinstance(raw, dict):
        raise SafetensorsError("header JSON is not an object")
    metadata = _metadata(raw.pop(METADATA_KEY, None))
    tensors = [_tensor(name, entry) for name, entry in raw.items()]
    tensors.sort(key=lambda t: (t.start, t.end))
    _check_layout(tensors, data_size=file_size - 8 - n)
    return Header(header_size=n, tensors=tuple(tensors), metadata=metadata, file_size=file_size)


def parse_file_bytes(buf: bytes) -> Header:
    """Validate a whole file held in memory (used by tests and fuzzing)."""
    n = parse_header_size(buf[:8], len(buf))
    return parse_header(buf[8 : 8 + n], len(buf))


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise SafetensorsError(f"duplicate key {k[:100]!r} in header")
        out[k] = v
    return out


def _no_constants(name: str) -> Any:
    raise SafetensorsError(f"header contains the non-JSON number {name}")


def _metadata(value: Any) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, dict):
        raise SafetensorsError(f"{METADATA_KEY} must be an object of strings, got {type(value).__name__}")
    for k, v in value.items():
        if not isinstance(v, str):
            raise SafetensorsError(f"{METADATA_KEY}[{k[:100]!r}] must be a string, got {type(v).__name__}")
    return dict(value)


def _is_uint(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and 0 <= x < 2**64


def _tensor(name: str, entry: Any) -> TensorInfo:
    where = f"tensor {name[:100]!r}"
    if not isinstance(entry, dict):
        raise SafetensorsError(f"{where}: entry must be an object, got {type(entry).__name__}")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in entry:
            raise SafetensorsError(f"{where}: missing {key!r}")
    dtype = entry["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise SafetensorsError(f"{where}: unknown dtype {str(dtype)[:40]!r}")
    shape = entry["shape"]
    if not isinstance(shape, list) or not all(_is_uint(d) for d in shape):
        raise SafetensorsError(f"{where}: shape must be a list of non-negative integers")
    offsets = entry["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(o) for o in offsets)):
        raise SafetensorsError(f"{where}: data_offsets must be two non-negative integers")
    start, end = offsets
    if end < start:
        raise SafetensorsError(f"{where}: data_offsets end {end} is before start {start}")
    numel = 1
    for d in shape:  # stop early: a hostile shape must not build a huge integer
        numel *= d
        if numel >= 2**64:
            raise SafetensorsError(f"{where}: shape {shape[:8]}... has more than 2**64 elements")
    bits = numel * DTYPE_BITS[dtype]
    if bits % 8:
        raise SafetensorsError(f"{where}: {dtype} x {numel} elements is not a whole number of bytes")
    if bits // 8 != end - start:
        raise SafetensorsError(
            f"{where}: shape {shape[:8]} of {dtype} needs {bits // 8} bytes, but data_offsets span {end - start}"
        )
    return TensorInfo(name=name, dtype=dtype, shape=tuple(shape), start=start, end=end)


def _check_layout(tensors: list[TensorInfo], data_size: int) -> None:
    """Offsets must tile the data section exactly: from 0, no gap, no overlap, no trailing bytes."""
    pos = 0
    for t in tensors:
        if t.start != pos:
            kind = "overlaps the previous tensor" if t.start < pos else f"leaves a gap after byte {pos}"
            raise SafetensorsError(f"tensor {t.name[:100]!r}: data_offsets [{t.start}, {t.end}] {kind}")
        pos = t.end
    if pos > data_size:
        raise SafetensorsError(
            f"tensor data ends at byte {pos} but the file holds {data_size} data bytes (truncated file?)"
        )
    if pos < data_size:
        raise SafetensorsError(f"{data_size - pos} trailing bytes after the last tensor")
