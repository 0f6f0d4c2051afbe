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
from pathlib import Path

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

    Huge pages cover only the 2 MiB-aligned ranges that lie wholly inside one memory area, and a value's mapping is
    a few bytes longer than a multiple of 2 MiB (`value_layout`), so it starts off a huge-page boundary. Mappings
    made one after the other lie next to each other and, with the same flags, merge into one area: the ranges
    across their edges are huge pages too once the neighbour exists before the bytes there arrive (`ValuePool`
    places one ahead). One area for many values also keeps Linux's `vm.max_map_count` (65530 areas by default)
    out of reach, which one area per value would not be: 65530 values of 4 MiB are only 256 GiB.
    """
    m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if size >= _HUGE_FROM and hasattr(mmap, "MADV_HUGEPAGE"):
        with contextlib.suppress(OSError):
            m.madvise(mmap.MADV_HUGEPAGE)
    return m


def value_layout(size: int, shared: bool) -> tuple[int, int]:
    """Where a value of `size` bytes lies in the mapping made for it: (its offset, the mapping's length).

    A memfd-backed value (`shared`) fills its memfd from offset 0, since a client maps the memfd it is handed.
    Any other starts as many bytes into its mapping as the header of the GET reply that sends it (`$<size>\r\n`).
    Over TCP that header and the value land back to back in the socket's page fragments, which start from a
    fresh page when the client has read everything before: the kernel then copies the value to an address just
    ahead of the source's within a 4 KiB page, which this machine copies at a third of the speed (4K aliasing:
    the stores look like they might overlap the loads following them). One client's 4 MiB GETs, page-aligned,
    cost the server 331-479 ms of kernel CPU per GB against 222-223 placed this way, and ran at 1.16-1.66 GB/s
    against 2.03-2.20 (alternating, another job compiling; the kvserver README has the rest). Receiving a SET
    into it stays fast: there the source, after the command's longer header, is further into its page than the
    value is into its own.
    """
    if shared and size >= SHARED_FROM:
        return 0, size
    offset = len(b"$%d\r\n" % size)
    return offset, offset + size


def value_buffer(size: int, shared: bool) -> memoryview:
    """A fresh buffer of `size` bytes to receive a value into, placed in its mapping as `value_layout` says."""
    offset, length = value_layout(size, shared)
    m = value_mapping(length, shared=shared and offset == 0)
    return memoryview(m)[len(m) - size :]


def mapping_refused(size: int, error: OSError) -> str:
    """Why no mapping could be made for a value of `size` bytes, with the memory areas in use against
    `vm.max_map_count`, so whoever reads it can tell an exhausted area count from a capped address space."""
    try:
        areas = len(Path("/proc/self/maps").read_text().splitlines())
        limit = Path("/proc/sys/vm/max_map_count").read_text().strip()
        where = f" ({areas} memory areas in use, vm.max_map_count {limit})"
    except OSError:
        where = ""
    return f"no memory could be mapped for a value of {size} bytes: {error.strerror or error}{where}"


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

    A fresh mapping of 2 MiB or more gets a neighbour before it is filled: `spare`, one untouched mapping of the
    same length made right after it, which Linux places next to it (and merges with it), and which the next fresh
    value of that length takes. Without it, the huge-page ranges across a value's two edges were filled before the
    area reached past them and got small pages: 2 of 4 MiB in huge pages per 4 MiB value, 128 fresh values filled
    at 4.4-4.6 GB/s here (5 runs), against 4 of 4 and 17.4-17.8 GB/s with the neighbour where the kernel had huge
    pages free (3 of 5 runs; 0.8 and 4.2 where it compacted memory first). The spare costs address space, and at
    most the one huge page that its filled neighbour reaches into.
    """

    def __init__(self, limit: int, shared: bool = False) -> None:
        self.limit = limit
        self.shared = shared
        self.held = 0
        self.pending: deque[tuple[mmap.mmap, int]] = deque()  # (mapping, size of the value it held)
        self.ready: dict[int, list[mmap.mmap]] = {}  # by the size of value they fit
        self.reused = 0
        self.created = 0
        self.spare: mmap.mmap | None = None

    def take(self, size: int) -> memoryview:
        """A buffer of `size` bytes to receive a value into: a recycled mapping when one fits, else a new one.

        A value lies at the end of its mapping (`value_layout`), so a mapping that held a value of this size
        fits the new one the same way. Mappings are counted by the values they fit: the few header bytes before
        a value are not the pool's to budget.
        """
        free = self.ready.get(size)
        if not free and self.pending:
            self._sweep()
            free = self.ready.get(size)
        if free:
            m = free.pop()
            self.held -= size
            self.reused += 1
            return memoryview(m)[len(m) - size :]
        self.created += 1
        offset, length = value_layout(size, self.shared)
        if offset == 0 and self.shared:
            return value_buffer(size, self.shared)
        m = self._fresh(length)
        return memoryview(m)[length - size :]

    def _fresh(self, length: int) -> mmap.mmap:
        """A new anonymous mapping of `length` bytes with its neighbour in place (see the class)."""
        if length < _HUGE_FROM:
            return new_mapping(length)
        m, self.spare = self.spare, None
        if m is None or len(m) != length:
            if m is not None:
                m.close()
            m = new_mapping(length)
        with contextlib.suppress(OSError):  # out of address space: the value goes without its neighbour
            self.spare = new_mapping(length)
        return m

    def give(self, value: object) -> None:
        """L1 no longer holds `value`: keep its mapping for reuse once nothing else refers to it."""
        if not isinstance(value, memoryview) or not isinstance(value.obj, mmap.mmap):
            return
        m, size = value.obj, value.nbytes
        if getattr(m, "exported", False):
            return  # a client was given its pages: they must never change, so they go when the last user lets go
        if any(p is m for p, _ in self.pending):
            return  # already waiting (dropped twice): handing it out twice would share one buffer
        if self.held + size > self.limit:
            self._sweep()
            if self.held + size > self.limit:
                self._drop_ready(size)
            if self.held + size > self.limit:
                return  # freed when its last reference goes
        self.pending.append((m, size))
        self.held += size

    def _sweep(self) -> None:
        for _ in range(len(self.pending)):
            m, size = self.pending.popleft()
            if _unused(m):
                self.ready.setdefault(size, []).append(m)
            else:
                self.pending.append((m, size))

    def _drop_ready(self, need: int) -> None:
        """Unmap ready mappings of other sizes until `need` bytes fit (the value sizes in use changed)."""
        for size in list(self.ready):
            free = self.ready[size]
            while free and self.held + need > self.limit:
                free.pop().close()
                self.held -= size
            if not free:
                del self.ready[size]
