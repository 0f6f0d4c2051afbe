"""Where large values lie in memory, and how their mappings are recycled: real mappings, no server."""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import pytest
from strata_kv.valuepool import ValuePool, value_buffer, value_layout

MiB = 1024 * 1024


def _address(view: memoryview) -> int:
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def test_a_value_starts_as_far_into_its_page_as_the_header_of_its_get_reply() -> None:
    """The GET reply's header and value land back to back in the socket's pages: the value's source must sit at
    the same offset within a page as its destination, or the kernel's copy runs at a third of the speed."""
    for size in (256 * 1024, 4 * MiB, 7 * MiB + 3, 64 * MiB):
        view = value_buffer(size, shared=False)
        header = len(b"$%d\r\n" % size)
        assert len(view) == size
        assert _address(view) % mmap.PAGESIZE == header, size
        assert value_layout(size, shared=False) == (header, header + size)


def _areas_holding(views: list[memoryview]) -> int:
    """How many memory areas (VMAs, the count `vm.max_map_count` bounds) the views lie in."""
    areas = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        areas.append((start, end))
    return len({next(a for a in areas if a[0] <= _address(v) < a[1]) for v in views})


def _huge_page_bytes() -> int:
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0


def _fill(view: memoryview) -> None:
    ctypes.memset(_address(view), 1, len(view))


def test_fresh_values_made_one_after_another_share_memory_areas() -> None:
    """One area per value would let `vm.max_map_count` (65530) cap L1 at 256 GiB of 4 MiB values. Linux puts a
    new mapping into the highest gap that fits, which in a process that freed memory before may be a hole among
    others' areas, so some values start areas of their own: most do not."""
    pool = ValuePool(limit=0)
    values = []
    for _ in range(64):
        values.append(pool.take(4 * MiB))
        values[-1][0] = 1  # touched, as a received value is
    assert _areas_holding(values) <= 16, _areas_holding(values)


def test_fresh_values_are_backed_by_huge_pages_across_their_edges() -> None:
    """A value's mapping is a few bytes longer than 4 MiB, so it starts off a 2 MiB boundary; its neighbour is in
    place before it fills, so the huge-page ranges across its edges lie inside one area and get huge pages too."""
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    if "[never]" in mode:
        pytest.skip(f"transparent huge pages are off on this machine: {mode.strip()}")
    pool = ValuePool(limit=0)
    before = _huge_page_bytes()
    values = []
    for _ in range(16):  # each filled before the next is taken, as a server receives them
        values.append(pool.take(4 * MiB))
        _fill(values[-1])
    huge = _huge_page_bytes() - before
    assert huge >= 15 * 4 * MiB, f"{huge / MiB} MiB of 64 in huge pages"


def test_memfd_backed_values_fill_their_memfd_from_offset_zero() -> None:
    """A client maps the memfd it is handed from its start: a shared value cannot be shifted."""
    view = value_buffer(4 * MiB, shared=True)
    assert value_layout(4 * MiB, shared=True) == (0, 4 * MiB)
    assert view.nbytes == len(view.obj) == 4 * MiB


def test_the_pool_budgets_values_not_mappings_and_recycles_them_in_place() -> None:
    """A budget of exactly two values keeps two dropped ones (their mappings are a few bytes longer), and a
    recycled mapping gives the next value of that size the same place in it."""
    size = 4 * MiB
    pool = ValuePool(limit=2 * size)
    first, second = pool.take(size), pool.take(size)
    addresses = {_address(first), _address(second)}
    pool.give(first)
    pool.give(second)
    assert pool.held == 2 * size
    del first, second
    again = [pool.take(size), pool.take(size)]
    assert pool.reused == 2 and pool.held == 0
    assert {_address(v) for v in again} == addresses
    assert all(len(v) == size for v in again)


def test_a_mapping_still_referenced_is_not_handed_out_again() -> None:
    pool = ValuePool(limit=8 * MiB)
    value = pool.take(4 * MiB)
    value[:5] = b"hello"
    reply_slice = value[:1024]  # a GET reply still being sent
    pool.give(value)
    del value
    other = pool.take(4 * MiB)
    assert pool.reused == 0
    other[:5] = b"XXXXX"
    assert bytes(reply_slice[:5]) == b"hello"
