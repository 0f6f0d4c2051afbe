"""Read planning, pure: validated headers in, large coalesced byte ranges out.

Few large reads beat many small ones on every storage we target (network filesystems, S3, NVMe); batches group
whole tensors so each can be handed out as soon as its batch is in.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from ..core.format import Header, TensorInfo

DEFAULT_BATCH_BYTES = 64 * 2**20


@dataclass(frozen=True, slots=True)
class Batch:
    """A contiguous byte range of one file holding whole tensors. `offset` is absolute in the file."""

    file_index: int
    offset: int
    length: int
    tensors: tuple[TensorInfo, ...]

    def chunks(self, block_size: int) -> list[tuple[int, int]]:
        """(offset within the batch, length) pieces read in parallel."""
        return split_range(self.length, block_size)


def split_range(length: int, block_size: int) -> list[tuple[int, int]]:
    if block_size < 1:
        raise ValueError(f"block size must be positive, got {block_size}")
    return [(o, min(block_size, length - o)) for o in range(0, length, block_size)]


def plan_file(header: Header, file_index: int, batch_bytes: int = DEFAULT_BATCH_BYTES) -> list[Batch]:
    """Group consecutive tensors into batches of at most `batch_bytes`; a bigger tensor is a batch alone."""
    batches: list[Batch] = []
    group: list[TensorInfo] = []
    size = 0
    for t in header.tensors:
        if group and size + t.nbytes > batch_bytes:
            batches.append(_batch(header, file_index, group))
            group, size = [], 0
        group.append(t)
        size += t.nbytes
    if group:
        batches.append(_batch(header, file_index, group))
    return batches


def _batch(header: Header, file_index: int, group: list[TensorInfo]) -> Batch:
    start, end = group[0].start, group[-1].end
    return Batch(file_index, header.data_offset + start, end - start, tuple(group))


def plan_files(headers: Sequence[Header], batch_bytes: int = DEFAULT_BATCH_BYTES) -> list[Batch]:
    """Interleave the files' batches round-robin, so many files are read at once rather than one by one."""
    per_file = [plan_file(h, i, batch_bytes) for i, h in enumerate(headers)]
    out: list[Batch] = []
    for k in range(max((len(b) for b in per_file), default=0)):
        out.extend(b[k] for b in per_file if k < len(b))
    return out


@dataclass(frozen=True, slots=True)
class Run:
    """A contiguous piece of a tensor slice: `length` bytes at absolute file `offset`."""

    offset: int
    length: int


@dataclass(frozen=True, slots=True)
class Span:
    """One read covering consecutive runs; runs are copied out of it (or read in place when it is one run)."""

    offset: int
    length: int
    runs: tuple[Run, ...]


def slice_runs(
    base: int, shape: Sequence[int], itemsize: int, bounds: Sequence[tuple[int, int]]
) -> tuple[list[Run], tuple[int, ...]]:
    """Byte runs of the row-major sub-block `bounds` (start, stop per dim) of a tensor stored at `base`.

    Returns the runs in output order and the result's shape. Concatenated, the runs are the sliced tensor.
    """
    if len(bounds) != len(shape):
        raise ValueError(f"need bounds for all {len(shape)} dims, got {len(bounds)}")
    out_shape = tuple(stop - start for start, stop in bounds)
    if any(n <= 0 for n in out_shape):
        return [], out_shape
    # the innermost dims that are taken whole merge into one run
    k = len(shape) - 1
    while k >= 0 and bounds[k] == (0, shape[k]):
        k -= 1
    if k < 0:
        return [Run(base, _prod(shape) * itemsize)], out_shape
    strides = [itemsize * _prod(shape[d + 1 :]) for d in range(len(shape))]
    run_len = (bounds[k][1] - bounds[k][0]) * strides[k]
    starts = [base + bounds[k][0] * strides[k]]
    for d in range(k - 1, -1, -1):
        lo, hi = bounds[d]
        starts = [s + i * strides[d] for i in range(lo, hi) for s in starts]
    # the loop above builds outer dims last; restore row-major order
    starts.sort()
    return [Run(s, run_len) for s in starts], out_shape


def coalesce(runs: Sequence[Run], max_gap: int, max_span: int) -> list[Span]:
    """Merge runs whose gaps are at most `max_gap` into spans of at most `max_span` bytes (one run may
    exceed it)."""
    spans: list[Span] = []
    cur: list[Run] = []
    for r in runs:
        if cur:
            end = cur[-1].offset + cur[-1].length
            if r.offset - end > max_gap or r.offset + r.length - cur[0].offset > max_span:
                spans.append(_span(cur))
                cur = []
        cur.append(r)
    if cur:
        spans.append(_span(cur))
    return spans


def _span(runs: list[Run]) -> Span:
    return Span(runs[0].offset, runs[-1].offset + runs[-1].length - runs[0].offset, tuple(runs))


def _prod(xs: Sequence[int]) -> int:
    p = 1
    for x in xs:
        p *= x
    return p
