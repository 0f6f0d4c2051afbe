"""Runs planned reads: many block-sized reads in flight on a thread pool, batches handed out in plan order.

The caller gets each batch as soon as all of its blocks are in. A pooled buffer is returned to the pool
when the
caller asks for the next batch: that is the lifetime rule of anything viewing it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import Future, wait

import torch

from ..core.concurrency import finish, thread_pool
from ..core.sources import RangeReader
from .buffers import BufferPool, alloc_host
from .planner import Batch, split_range


def writable_view(buf: torch.Tensor) -> memoryview:
    """A writable memoryview onto a contiguous uint8 tensor (pread writes straight into tensor memory)."""
    return memoryview(buf.numpy()).cast("B")  # type: ignore[arg-type]


def read_ranges(jobs: Iterable[tuple[RangeReader, int, memoryview]], block_size: int, concurrency: int) -> None:
    """Fill every (reader, file offset, destination) job, split into parallel block-sized reads."""
    ex = thread_pool(concurrency)
    futures = [
        ex.submit(reader.read_into, offset + o, dest[o : o + n])
        for reader, offset, dest in jobs
        for o, n in split_range(len(dest), block_size)
    ]
    finish(futures)


def stream_batches(
    readers: Sequence[RangeReader],
    batches: Sequence[Batch],
    pool: BufferPool | None,
    block_size: int,
    concurrency: int,
    max_inflight_bytes: int = 2**30,
) -> Iterator[tuple[Batch, torch.Tensor]]:
    """Yield (batch, buffer) in plan order while later batches are already being read.

    With a pool, at most `pool.slots` batches are in memory; a batch larger than a slot is read alone, into
    one spare buffer that grows to the largest such batch and is reused. Without a pool every buffer is fresh
    (safe to keep) and at most `max_inflight_bytes` are being read ahead of the caller.
    """
    ex = thread_pool(concurrency)
    pending: deque[tuple[Batch, torch.Tensor, list[Future[None]], bool]] = deque()
    todo = deque(batches)
    spare: list[torch.Tensor] = []  # with a pool: the buffer of the last oversized batch

    def inflight() -> int:
        return sum(p[0].length for p in pending)

    def submit() -> bool:
        batch = todo[0]
        pooled = pool is not None and batch.length <= pool.slot_bytes
        if pooled:
            assert pool is not None
            got = pool.try_acquire()
            if got is None:
                return False
            buf = got[: batch.length]
            keep = got
        elif pending and (pool is not None or inflight() + batch.length > max_inflight_bytes):
            return False  # waits until the pipeline drains, bounding memory
        elif pool is not None and spare and spare[0].numel() >= batch.length:
            keep = spare.pop()
            buf = keep[: batch.length]
        else:
            spare.clear()
            buf = keep = alloc_host(batch.length)
        todo.popleft()
        mv = writable_view(buf) if batch.length else memoryview(bytearray())
        reader = readers[batch.file_index]
        futs = [ex.submit(reader.read_into, batch.offset + o, mv[o : o + n]) for o, n in batch.chunks(block_size)]
        pending.append((batch, keep, futs, pooled))
        return True

    try:
        while todo or pending:
            while todo and submit():
                pass
            batch, buf, futs, pooled = pending.popleft()
            try:
                finish(futs)
                yield batch, buf[: batch.length]
            finally:
                if pooled and pool is not None:
                    pool.release(buf)
                elif pool is not None:
                    spare[:] = [buf]
    finally:
        for _, buf, futs, pooled in pending:
            for f in futs:
                f.cancel()
            wait(futs)
            if pooled and pool is not None:
                pool.release(buf)
