"""Host memory for reads. First-touch page faults, not the disk, bound a loader on this class of machine
(measured on the 2-core CI machine, 2026-11-29: fresh memory fills at 0.4-11 GB/s from run to run, memory
already touched copies at 12+ GB/s), so streaming reuses a pool of buffers faulted in once. Measured here:
advising transparent huge pages made first touch ~10x slower (direct compaction on fault), so plain allocations
are used."""

from __future__ import annotations

import threading

import torch


def alloc_host(nbytes: int, prefault: bool = False) -> torch.Tensor:
    """A fresh uint8 host tensor; views of it own a reference, so they are safe to keep."""
    buf = torch.empty(max(nbytes, 0), dtype=torch.uint8)
    if prefault:
        buf.fill_(0)
    return buf


class BufferPool:
    """A fixed set of equally sized, pre-faulted host buffers handed out and returned; never grows.

    `pinned` buffers (page-locked, CUDA only) make host->GPU copies asynchronous.
    """

    def __init__(self, slot_bytes: int, slots: int, pinned: bool = False) -> None:
        if slots < 1 or slot_bytes < 1:
            raise ValueError(f"buffer pool needs at least one slot of >0 bytes (got {slots} x {slot_bytes})")
        self.slot_bytes = slot_bytes
        if pinned:
            self._free = [torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(slots)]
        else:
            self._free = [alloc_host(slot_bytes, prefault=True) for _ in range(slots)]
        self.slots = slots
        self._cond = threading.Condition()

    def acquire(self) -> torch.Tensor:
        with self._cond:
            while not self._free:
                self._cond.wait()
            return self._free.pop()

    def try_acquire(self) -> torch.Tensor | None:
        with self._cond:
            return self._free.pop() if self._free else None

    def release(self, buf: torch.Tensor) -> None:
        with self._cond:
            self._free.append(buf)
            self._cond.notify()

    @property
    def available(self) -> int:
        with self._cond:
            return len(self._free)
