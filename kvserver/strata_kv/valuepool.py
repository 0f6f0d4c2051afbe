"""Mappings of large values that L1 let go, kept for the next value of the same size.

Filling fresh memory is bound by page faults here (0.3-1.3 GB/s measured, against ~10 GB/s into pages
already touched), and engines send chunks of one size per model, so reusing a dropped value's mapping
for the next value of that size turns a SET's receive into a copy into warm pages. A mapping is
reused only once nothing refers to it any more: a GET reply still being sent from it holds it, and
mmap refuses to resize while any view of it lives, which is the test (`_unused`).
"""

from __future__ import annotations

import contextlib
import logging
import mmap
from collections import deque

from .shared_memory import SHARED_FROM, shared_mapping

log = logging.getLogger(__name__)

_HUGE_FROM = 2 * 1024 * 1024


def new_mapping(size: int) -> mmap.mmap:
    """A private anonymous mapping of exactly `size` bytes; the kernel backs it only as bytes arrive.

    Huge pages, where the kernel offers them on request, cut the page faults of filling it 512-fold. Private, not
    shared: Python's default anonymous mapping is MAP_SHARED, which Linux backs with shmem, and shmem takes huge
    pages only where `shmem_enabled` allows (here and by default: `never`), while private anonymous memory takes
    them on `madvise` (the default `enabled` mode). Filling a fresh 64 MiB mapping here: 1.0 GB/s shared,
    3.7 GB/s private with MADV_HUGEPAGE.
    """
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if size >= _HUGE_FROM and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            m.madvise(mmap.MADV_HUGEPAGE)
    return m


def _unused(m: mmap.mmap) -> bool:
    try:
        m.resize(len(m))  # refused while a view (the stored value, a reply's slice) still exists
    except BufferError:
        return False
    except (OSError, ValueError, SystemError):
        return False  # resizing unsupported here: never reuse
    return True


def value_mapping(size: int, shared: bool) -> mmap.mmap:
    """A mapping to receive a value of `size` bytes into: memfd-backed when values may be handed to clients as
    memory (`listen.shared_memory`) and large enough, else anonymous (also when no fd is left to make a memfd)."""
    if shared and size >= SHARED_FROM:
        try:
            return shared_mapping(size)
        except OSError as error:  # EMFILE/ENFILE: out of descriptors; the value is still stored, only inline
            log.warning("value of %d bytes kept in anonymous memory: %s", size, error)
    return new_mapping(size)


class ValuePool:
    """At most `limit` bytes of mappings, waiting to be unreferenced (`pending`) or ready (`ready`).

    With `shared`, new mappings are memfd-backed (see `shared_memory`); one that was handed to a client is
    never reused, since the client may still read it.
    """

    def __init__(self, limit: int, shared: bool = False) -> None:
        self.limit = limit
        self.shared = shared
        self.held = 0
        self.pending: deque[mmap.mmap] = deque()
        self.ready: dict[int, list[mmap.mmap]] = {}
        self.reused = 0
        self.created = 0

    def take(self, size: int) -> memoryview:
        """A buffer of `size` bytes to receive a value into: a recycled mapping when one fits, else a new one."""
        free = self.ready.get(size)
        if not free and self.pending:
            self._sweep()
            free = self.ready.get(size)
        if free:
            m = free.pop()
            self.held -= size
            self.reused += 1
            return memoryview(m)
        self.created += 1
        return memoryview(value_mapping(size, self.shared))

    def give(self, value: object) -> None:
        """L1 no longer holds `value`: keep its mapping for reuse once nothing else refers to it."""
        if not isinstance(value, memoryview) or not isinstance(value.obj, mmap.mmap):
            return
        m = value.obj
        if getattr(m, "exported", False):
            return  # a client was given its pages: they must never change, so they go when the last user lets go
        if any(p is m for p in self.pending):
            return  # already waiting (dropped twice): handing it out twice would share one buffer
        if self.held + len(m) > self.limit:
            self._sweep()
            if self.held + len(m) > self.limit:
                self._drop_ready(len(m))
            if self.held + len(m) > self.limit:
                return  # freed when its last reference goes
        self.pending.append(m)
        self.held += len(m)

    def _sweep(self) -> None:
        for _ in range(len(self.pending)):
            m = self.pending.popleft()
            if _unused(m):
                self.ready.setdefault(len(m), []).append(m)
            else:
                self.pending.append(m)

    def _drop_ready(self, need: int) -> None:
        """Unmap ready mappings of other sizes until `need` bytes fit (the value sizes in use changed)."""
        for size in list(self.ready):
            free = self.ready[size]
            while free and self.held + need > self.limit:
                free.pop().close()
                self.held -= size
            if not free:
                del self.ready[size]
