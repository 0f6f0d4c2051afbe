"""Public loading API: a drop-in `load_file`, a streaming iterator over many files, and tensor-parallel
slices.

Lifetime rule: tensors from `load_file`, `load_files`, `SafetensorsFile` and `iter_tensors(copy=True)` own
their
memory and are safe to keep. `iter_tensors(copy=False)` yields views into reused buffers that are valid
only until
the next item is requested: copy what you keep (the bug other streamers shipped, sglang #22749, is keeping
them).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch

from ..contract import DEFAULT_BLOCK_SIZE, DEFAULT_MEMORY_LIMIT
from ..core.concurrency import concurrency_for, finish, thread_pool
from ..core.copy_lock import hold_copies
from ..core.format import Header, TensorInfo
from ..core.sources import RangeReader, open_reader, read_header
from .buffers import BufferPool, alloc_host
from .executor import read_ranges, stream_batches, writable_view
from .planner import DEFAULT_BATCH_BYTES, Span, coalesce, plan_files, slice_runs
from .torch_dtypes import torch_dtype, view_tensor

PathLike = str | os.PathLike[str]


def load_file(filename: PathLike, device: str | int | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Same signature and result as `safetensors.torch.load_file`, read with large parallel reads."""
    return load_files([filename], device=device)


def load_files(
    filenames: Sequence[PathLike],
    device: str | int | torch.device = "cpu",
    *,
    concurrency: int | None = None,
    block_size: int = DEFAULT_BLOCK_SIZE,
) -> dict[str, torch.Tensor]:
    """Load many files at once into one dict (names must be unique across files, as in sharded
    checkpoints)."""
    dev = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
    concurrency = concurrency_for(filenames, concurrency)
    if dev.type != "cpu":
        return dict(iter_tensors(filenames, device=dev, concurrency=concurrency, block_size=block_size))
    held = hold_copies(filenames)  # a node copy being read is not evicted meanwhile
    readers = [open_reader(f) for f in filenames]
    try:
        headers = list(thread_pool(concurrency).map(read_header, readers))
        # one fresh host buffer per file: the result owns it, so no copy-out is needed
        bufs = [alloc_host(h.file_size - h.data_offset) for h in headers]
        read_ranges(
            (
                (r, h.data_offset, writable_view(b))
                for r, h, b in zip(readers, headers, bufs, strict=True)
                if h.file_size > h.data_offset
            ),
            block_size,
            concurrency,
        )
        out: dict[str, torch.Tensor] = {}
        for h, buf in zip(headers, bufs, strict=True):
            for t in h.tensors:  # file order, as safetensors.torch.load_file returns them
                if t.name in out:
                    raise ValueError(f"tensor {t.name!r} appears in more than one file")
                out[t.name] = view_tensor(buf, t.start, t)
        return out
    finally:
        for r in readers:
            r.close()
        held.close()


def iter_tensors(
    filenames: Sequence[PathLike],
    device: str | torch.device = "cpu",
    *,
    copy: bool = True,
    memory_limit: int = DEFAULT_MEMORY_LIMIT,
    batch_bytes: int = DEFAULT_BATCH_BYTES,
    block_size: int = DEFAULT_BLOCK_SIZE,
    concurrency: int | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) from many files, each as soon as its bytes are in, holding <= `memory_limit` of
    read-ahead buffers. On CUDA, reads land in pinned buffers and host->GPU copies overlap the next reads."""
    dev = torch.device(device)
    on_gpu = dev.type == "cuda"
    concurrency = concurrency_for(filenames, concurrency)
    held = hold_copies(filenames)  # a node copy being read is not evicted meanwhile
    readers = [open_reader(f) for f in filenames]
    try:
        headers = list(thread_pool(concurrency).map(read_header, readers))
        batches = plan_files(headers, batch_bytes)
        pool = None
        if not copy or on_gpu:
            # enough slots to keep every reader busy while the caller consumes one batch, within the limit
            wanted = 2 + -(-concurrency * block_size // batch_bytes)
            slots = max(2, min(memory_limit // batch_bytes, wanted))
            pool = BufferPool(batch_bytes, slots, pinned=on_gpu and torch.cuda.is_available())
        stream = torch.cuda.Stream(dev) if on_gpu else None
        for batch, buf in stream_batches(readers, batches, pool, block_size, concurrency, memory_limit):
            base = headers[batch.file_index].data_offset
            views = [(t.name, view_tensor(buf, base + t.start - batch.offset, t)) for t in batch.tensors]
            if stream is not None:
                with torch.cuda.stream(stream):
                    moved = [(n, v.to(dev, non_blocking=True)) for n, v in views]
                stream.synchronize()  # the pinned buffer is reused after this batch
                for _, t in moved:  # allocated on our stream, used on the caller's: tell the allocator
                    t.record_stream(torch.cuda.current_stream(dev))
                yield from moved
            else:
                yield from views
    finally:
        for r in readers:
            r.close()
        held.close()


class SafetensorsFile:
    """Like `safetensors.safe_open(path, "pt")`: read single tensors or slices of them without the rest."""

    def __init__(
        self, filename: PathLike, *, concurrency: int | None = None, block_size: int = DEFAULT_BLOCK_SIZE
    ) -> None:
        self.reader: RangeReader = open_reader(filename)
        concurrency = concurrency_for([filename], concurrency)
        self.header: Header = read_header(self.reader)
        self._by_name = self.header.by_name()
        self.concurrency, self.block_size = concurrency, block_size

    def keys(self) -> list[str]:
        return sorted(self._by_name)

    def metadata(self) -> dict[str, str] | None:
        return self.header.metadata

    def info(self, name: str) -> TensorInfo:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{self.reader.name}: no tensor named {name!r}") from None

    def get_tensor(self, name: str) -> torch.Tensor:
        t = self.info(name)
        buf = alloc_host(t.nbytes)
        if t.nbytes:
            read_ranges(
                [(self.reader, self.header.data_offset + t.start, writable_view(buf))],
                self.block_size,
                self.concurrency,
            )
        return view_tensor(buf, 0, t)

    def get_slice(self, name: str) -> TensorSlice:
        return TensorSlice(self, self.info(name))

    def shard(self, name: str, dim: int, rank: int, world_size: int) -> torch.Tensor:
        """Rank `rank`'s part of `name` split evenly along `dim` (what tensor-parallel layers load)."""
        t = self.info(name)
        if not t.shape:
            raise ValueError(f"tensor {name!r} is 0-d and cannot be sharded")
        size = t.shape[dim]
        if size % world_size:
            raise ValueError(f"dim {dim} of {name!r} has {size} rows, not divisible by {world_size} ranks")
        part = size // world_size
        index: list[slice] = [slice(None)] * len(t.shape)
        index[dim] = slice(rank * part, (rank + 1) * part)
        return self.get_slice(name)[tuple(index)]

    def close(self) -> None:
        self.reader.close()

    def __enter__(self) -> SafetensorsFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TensorSlice:
    """`get_slice(name)[...]`: reads only the bytes of the requested block (basic slices with step 1)."""

    MAX_GAP = 1 * 2**20

    def __init__(self, file: SafetensorsFile, info: TensorInfo) -> None:
        self.file, self.info = file, info

    def get_shape(self) -> list[int]:
        return list(self.info.shape)

    def get_dtype(self) -> str:
        return self.info.dtype

    def __getitem__(self, index: Any) -> torch.Tensor:
        info = self.info
        bounds, squeeze = _bounds(index, info.shape)
        dt = torch_dtype(info.dtype)
        base = self.file.header.data_offset + info.start
        runs, out_shape = slice_runs(base, info.shape, dt.itemsize, bounds)
        out = alloc_host(sum(r.length for r in runs))
        spans = coalesce(runs, self.MAX_GAP, self.file.block_size * 4)
        ex = thread_pool(self.file.concurrency)
        finish([ex.submit(self._read_span, s, out, p) for s, p in zip(spans, _positions(spans), strict=True)])
        result = out.view(dt).reshape(out_shape) if runs else torch.empty(out_shape, dtype=dt)
        return result.squeeze(squeeze) if squeeze else result

    def _read_span(self, span: Span, out: torch.Tensor, pos: int) -> None:
        dest = writable_view(out)
        if len(span.runs) == 1:
            self.file.reader.read_into(span.offset, dest[pos : pos + span.length])
            return
        tmp = bytearray(span.length)
        self.file.reader.read_into(span.offset, memoryview(tmp))
        for r in span.runs:
            rel = r.offset - span.offset
            dest[pos : pos + r.length] = tmp[rel : rel + r.length]
            pos += r.length


def _positions(spans: Sequence[Span]) -> list[int]:
    out, pos = [], 0
    for s in spans:
        out.append(pos)
        pos += sum(r.length for r in s.runs)
    return out


def _bounds(index: Any, shape: tuple[int, ...]) -> tuple[list[tuple[int, int]], tuple[int, ...]]:
    """Normalize ints/slices (step 1) and Ellipsis to (start, stop) per dim; ints are squeezed afterwards."""
    idx = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in idx):
        k = idx.index(Ellipsis)
        idx = idx[:k] + (slice(None),) * (len(shape) - len(idx) + 1) + idx[k + 1 :]
    if len(idx) > len(shape):
        raise IndexError(f"too many indices ({len(idx)}) for a tensor of {len(shape)} dims")
    idx = idx + (slice(None),) * (len(shape) - len(idx))
    bounds: list[tuple[int, int]] = []
    squeeze: list[int] = []
    for d, (i, n) in enumerate(zip(idx, shape, strict=True)):
        if isinstance(i, int) and not isinstance(i, bool):
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise IndexError(f"index {i} is out of range for dim {d} of size {n}")
            bounds.append((j, j + 1))
            squeeze.append(d)
        elif isinstance(i, slice):
            start, stop, step = i.indices(n)
            if step != 1:
                raise IndexError("only slices with step 1 are supported")
            bounds.append((start, max(start, stop)))
        else:
            raise IndexError(f"unsupported index {i!r}; use ints, slices and ...")
    return bounds, tuple(squeeze)
