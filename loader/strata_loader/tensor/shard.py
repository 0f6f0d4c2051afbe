"""Pre-sharding for tensor parallelism: one set of `model-rank-{rank}-part-{part}.safetensors` files per rank,
the layout vLLM's sharded loaders read, so each rank later loads only its own bytes.

Which dimension a weight splits along depends on the layer; the default rules cover Llama-family names
(column-parallel projections and embeddings on dim 0, row-parallel ones on dim 1, the rest replicated). Tensor
names are kept as in the source checkpoint.

Sharding moves bytes only, so it needs neither torch nor the `safetensors` package (the runtime image ships
neither): headers come from the strict parser, a split is a strided byte copy, and the files are written with
`writer`. Every source byte is read once; each rank's slice of it goes straight to that rank's file.
"""

from __future__ import annotations

import fnmatch
import json
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from ..contract import DEFAULT_BLOCK_SIZE
from ..core.concurrency import DEFAULT_CONCURRENCY, finish, thread_pool
from ..core.format import DTYPE_BITS, Header, TensorInfo
from ..core.sources import LocalReader, RangeReader, read_header
from .planner import split_range
from .writer import encode_header, layout

if TYPE_CHECKING:
    import torch

SHARD_NAME = "model-rank-{rank}-part-{part}.safetensors"

COPY_BYTES = 64 * 2**20
"""Bytes read per step while copying: the memory sharding holds, whatever the model's size."""

DEFAULT_RULES: tuple[tuple[str, int | None], ...] = (
    ("*embed_tokens.weight", 0),
    ("*lm_head.weight", 0),
    ("*q_proj.*", 0),
    ("*k_proj.*", 0),
    ("*v_proj.*", 0),
    ("*qkv_proj.*", 0),
    ("*gate_proj.*", 0),
    ("*up_proj.*", 0),
    ("*gate_up_proj.*", 0),
    ("*o_proj.weight", 1),
    ("*down_proj.weight", 1),
)


def shard_dim(
    name: str, shape: Sequence[int], tp: int, rules: Sequence[tuple[str, int | None]] = DEFAULT_RULES
) -> int | None:
    """The dimension `name` splits along for `tp` ranks, or None to replicate it."""
    for glob, dim in rules:
        if fnmatch.fnmatchcase(name, glob):
            if dim is None or dim >= len(shape) or shape[dim] % tp:
                return None  # e.g. fewer KV heads than ranks: every rank keeps the whole tensor
            return dim
    return None


def source_files(src: Path) -> list[Path]:
    return sorted(p for p in src.glob("*.safetensors") if not p.name.startswith("model-rank-"))


@dataclass(frozen=True, slots=True)
class _Item:
    """One source tensor as every rank stores it: whole (`dim` None) or split `pieces` ways along `dim`.

    Its bytes are `outer` rows of `pieces` equal runs of `run` bytes; rank r keeps run r of every row (or,
    replicated, the single run of the single row).
    """

    source: int
    info: TensorInfo
    dim: int | None
    outer: int
    pieces: int
    run: int

    @property
    def shape(self) -> tuple[int, ...]:
        if self.dim is None:
            return self.info.shape
        s = list(self.info.shape)
        s[self.dim] //= self.pieces
        return tuple(s)

    @property
    def nbytes(self) -> int:
        """What one rank stores."""
        return self.outer * self.run


def _item(source: int, info: TensorInfo, dim: int | None, tp: int) -> _Item:
    if dim is None:
        return _Item(source, info, None, 1, 1, info.nbytes)
    inner_bits = math.prod(info.shape[dim + 1 :]) * DTYPE_BITS[info.dtype]
    run_bits = info.shape[dim] // tp * inner_bits
    if run_bits % 8:
        raise ValueError(
            f"tensor {info.name!r}: a 1/{tp} slice of {info.dtype} {list(info.shape)} along dim"
            f" {dim} does not start on a byte boundary"
        )
    return _Item(source, info, dim, math.prod(info.shape[:dim]), tp, run_bits // 8)


def _plan(
    files: Sequence[Path],
    headers: Sequence[Header],
    tp: int,
    max_part_bytes: int,
    rules: Sequence[tuple[str, int | None]],
) -> list[list[_Item]]:
    """Parts in order, the same for every rank (each rank's slice of a tensor is the same size): files in name
    order, tensors in name order within each, a new part when the next tensor would pass the cap."""
    parts: list[list[_Item]] = [[]]
    size = 0
    seen: dict[str, Path] = {}
    for i, h in enumerate(headers):
        for info in sorted(h.tensors, key=lambda t: t.name):
            if info.name in seen:
                raise ValueError(f"tensor {info.name!r} is in both {seen[info.name]} and {files[i]}")
            seen[info.name] = files[i]
            item = _item(i, info, shard_dim(info.name, info.shape, tp, rules), tp)
            if parts[-1] and size + item.nbytes > max_part_bytes:
                parts.append([])
                size = 0
            parts[-1].append(item)
            size += item.nbytes
    return parts


def shard_directory(
    src: Path, out: Path, tp: int, max_part_bytes: int, rules: Sequence[tuple[str, int | None]] = DEFAULT_RULES
) -> list[Path]:
    """Write every rank's parts into `out`, each part at most `max_part_bytes` (a bigger tensor gets its
    own). Returns the paths rank by rank, parts in order."""
    if tp < 1:
        raise ValueError(f"tensor-parallel size must be >= 1, got {tp}")
    files = source_files(src)
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {src} to shard")
    out.mkdir(parents=True, exist_ok=True)
    readers: list[LocalReader] = []
    try:
        for f in files:
            readers.append(LocalReader(f))
        headers = [read_header(r) for r in readers]
        parts = _plan(files, headers, tp, max_part_bytes, rules)
        step = max(1, min(COPY_BYTES, max((i.info.nbytes for p in parts for i in p), default=0)))
        bufs = (np.empty(step, np.uint8), np.empty(step, np.uint8))
        by_rank: list[list[Path]] = [[] for _ in range(tp)]
        for part, items in enumerate(parts):
            paths = _write_part(out, part, tp, items, readers, headers, bufs)
            for rank, path in enumerate(paths):
                by_rank[rank].append(path)
    finally:
        for r in readers:
            r.close()
    return [p for paths in by_rank for p in paths]


def _write_part(
    out: Path,
    part: int,
    tp: int,
    items: Sequence[_Item],
    readers: Sequence[RangeReader],
    headers: Sequence[Header],
    bufs: tuple[np.ndarray, np.ndarray],
) -> list[Path]:
    """Part `part` of every rank: written to temporary files side by side, renamed once all are complete."""
    placed = layout((i.info.name, i.info.dtype, i.shape) for i in items)
    where = {p.name: p for p in placed}
    dims = json.dumps({i.info.name: i.dim for i in items if i.dim is not None}, sort_keys=True)
    paths = [out / SHARD_NAME.format(rank=rank, part=part) for rank in range(tp)]
    tmps = [p.with_name(p.name + ".tmp") for p in paths]
    fds: list[int] = []
    complete = False
    try:
        starts = []  # of each rank's data section: the headers differ in length with the rank's digits
        for rank, tmp in enumerate(tmps):
            tmp.unlink(missing_ok=True)  # a leftover, or a planted link: created afresh, never written through
            fds.append(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666))
            meta = {"format": "pt", "strata.tp_size": str(tp), "strata.rank": str(rank), "strata.shard_dims": dims}
            header = encode_header(placed, meta)
            _pwrite(fds[rank], memoryview(header), 0)
            starts.append(len(header))
        for item in sorted(items, key=lambda i: (i.source, i.info.start)):  # each source front to back
            at = where[item.info.name].start
            _copy(
                readers[item.source],
                headers[item.source].data_offset + item.info.start,
                item,
                [(fd, start + at) for fd, start in zip(fds, starts, strict=True)],
                bufs,
            )
        complete = True
    finally:
        for fd in fds:
            os.close(fd)
        if not complete:
            for tmp in tmps:
                tmp.unlink(missing_ok=True)
    for tmp, path in zip(tmps, paths, strict=True):
        os.replace(tmp, path)
    return paths


def _copy(
    reader: RangeReader, src: int, item: _Item, dests: Sequence[tuple[int, int]], bufs: tuple[np.ndarray, np.ndarray]
) -> None:
    """Copy `item` from absolute offset `src` to each rank's (file, offset): the whole tensor to every rank,
    or run r of every row to rank r."""
    if item.nbytes == 0:
        return
    buf, scratch = bufs
    step = len(buf)
    row = item.pieces * item.run
    if item.outer == 1 or row > step:  # runs long enough to copy one by one, in pieces of at most `step`
        for o in range(item.outer):
            for p in range(item.pieces):
                targets = dests if item.dim is None else [dests[p]]
                at = src + o * row + p * item.run
                for off, n in split_range(item.run, step):
                    piece = buf.data[:n]
                    _read(reader, at + off, piece)
                    for fd, base in targets:
                        _pwrite(fd, piece, base + o * item.run + off)
        return
    rows = step // row  # short runs: read whole rows at once, then gather each rank's runs
    for o in range(0, item.outer, rows):
        m = min(rows, item.outer - o)
        block = buf[: m * row]
        _read(reader, src + o * row, block.data)
        split = block.reshape(m, item.pieces, item.run)
        mine = scratch[: m * item.run]
        for p, (fd, base) in enumerate(dests):
            np.copyto(mine.reshape(m, item.run), split[:, p, :])
            _pwrite(fd, mine.data, base + o * item.run)


def _read(reader: RangeReader, offset: int, dest: memoryview) -> None:
    """Fill `dest` from `offset`, in parallel block-sized reads when it is large."""
    blocks = split_range(len(dest), DEFAULT_BLOCK_SIZE)
    if len(blocks) == 1:
        reader.read_into(offset, dest)
        return
    ex = thread_pool(DEFAULT_CONCURRENCY)
    finish([ex.submit(reader.read_into, offset + o, dest[o : o + n]) for o, n in blocks])


def _pwrite(fd: int, data: memoryview, offset: int) -> None:
    while data:
        n = os.pwrite(fd, data, offset)
        data, offset = data[n:], offset + n


def rank_files(directory: str | os.PathLike[str], rank: int) -> list[Path]:
    d = Path(directory)
    files = sorted(d.glob(f"model-rank-{rank}-part-*.safetensors"), key=lambda p: int(p.stem.rsplit("-", 1)[-1]))
    if not files:
        raise FileNotFoundError(f"no model-rank-{rank}-part-*.safetensors files in {d}")
    return files


def load_rank(
    directory: str | os.PathLike[str], rank: int, device: str | torch.device = "cpu"
) -> dict[str, torch.Tensor]:
    """Load one rank's pre-sharded weights (all its parts at once). Needs torch, unlike sharding itself."""
    from .api import load_files

    return load_files(rank_files(directory, rank), device=device)
