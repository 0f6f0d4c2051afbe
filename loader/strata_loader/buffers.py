"""Host memory for reads: huge-page backed, pre-faulted, and reused, because first-touch page faults (not the
disk) bound a loader on this class of machine (FACTS.md: fresh memory fills at 0.4-11 GB/s, touched at
12+)."""

from __future__ import annotations

import contextlib
import mmap
import threading

import torch

_HUGE = 2 * 2**20


def alloc_host(nbytes: int, prefault: bool = False) -> torch.Tensor:
    """A uint8 tensor over fresh anonymous memory advised for transparent huge pages.

    The tensor owns the mapping (it is freed when the last view goes), so views of it are safe to keep.
    """
    unit = _HUGE if nbytes >= _HUGE else mmap.PAGESIZE
    size = max(unit, -(-nbytes // unit) * unit)
    mm = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):  # THP disabled: small pages still work
            mm.madvise(mmap.MADV_HUGEPAGE)
    if prefault and hasattr(mmap, "MADV_POPULATE_WRITE"):
        try:
            mm.madvise(mmap.MADV_POPULATE_WRITE)
        except OSError:
            prefault_by_touch(mm)
    elif prefault:
        prefault_by_touch(mm)
    return torch.frombuffer(mm, dtype=torch.uint8)[:nbytes]


def prefault_by_touch(mm: mmap.mmap) -> None:
    for off in range(0, len(mm), 4096):
        mm[off] = 0


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
