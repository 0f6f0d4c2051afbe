"""Where large values lie in memory, and how their mappings are recycled: real mappings, no server."""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest
import strata_kv
from strata_kv.wire.valuepool import ValuePool, value_buffer, value_layout

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


# The layout tests measure in a Python process of their own: in pytest's, which has mapped and freed hundreds of
# MiB before, Linux puts new mappings into holes among others' areas, and what they measure is that history.
_LAYOUT_PROBE = r"""
import ctypes, json, sys
from pathlib import Path
from strata_kv.wire.valuepool import ValuePool

MiB = 1024 * 1024
HUGE = 2 * MiB


def address(view):
    return ctypes.addressof(ctypes.c_char.from_buffer(view))


def areas():
    found = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        start, end = (int(x, 16) for x in line.split()[0].split("-"))
        found.append((start, end))
    return found


def huge_page_bytes():
    for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024
    return 0


def huge_page_fallbacks():
    for line in Path("/proc/vmstat").read_text().splitlines():
        if line.startswith("thp_fault_fallback "):
            return int(line.split()[1])
    return 0


count, size, touch = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
pool = ValuePool(limit=0)
before, fallbacks = huge_page_bytes(), huge_page_fallbacks()
values, edges_inside = [], 0
for _ in range(count):  # each filled before the next is taken, as a server receives them
    value = pool.take(size)
    # The 2 MiB-aligned ranges its first and last bytes lie in: the kernel backs them with huge pages when they
    # fault only if each lies inside one memory area then, so this is looked at before the value is written.
    area = next(a for a in areas() if a[0] <= address(value) < a[1])
    first, last = address(value) // HUGE * HUGE, (address(value) + size - 1) // HUGE * HUGE + HUGE
    edges_inside += area[0] <= first and last <= area[1]
    if touch == "fill":
        ctypes.memset(address(value), 1, size)
    else:
        value[0] = 1
    values.append(value)
maps = areas()
holding = [next(a for a in maps if a[0] <= address(v) < a[1]) for v in values]
print(json.dumps({
    "areas": len(set(holding)),
    "edges_inside": edges_inside,
    "huge": huge_page_bytes() - before,
    "fallbacks": huge_page_fallbacks() - fallbacks,
}))
"""


def _layout(count: int, size: int, touch: str) -> dict[str, int]:
    """Take `count` fresh values of `size` bytes from a new pool in a fresh process, touch or fill each in turn."""
    done = subprocess.run(
        [sys.executable, "-c", _LAYOUT_PROBE, str(count), str(size), touch],
        env={**os.environ, "PYTHONPATH": str(Path(strata_kv.__file__).parents[1])},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, int] = json.loads(done.stdout)
    return result


def test_fresh_values_made_one_after_another_share_memory_areas() -> None:
    """One area per value would let `vm.max_map_count` (65530) cap L1 at 256 GiB of 4 MiB values."""
    layout = _layout(64, 4 * MiB, "touch")
    assert layout["areas"] <= 4, layout


def test_fresh_values_lie_where_huge_pages_can_back_them_across_their_edges() -> None:
    """A value's mapping is a few bytes longer than 4 MiB, so it starts off a 2 MiB boundary; its neighbour is in
    place before it fills, so the huge-page ranges across its edges lie inside one area and get huge pages too.
    Where the kernel had no free huge page at a fault (`thp_fault_fallback`, counted machine-wide) that 2 MiB is
    the kernel's, not the layout's: the count is allowed for, and shown."""
    mode = Path("/sys/kernel/mm/transparent_hugepage/enabled").read_text()
    if "[never]" in mode:
        pytest.skip(f"transparent huge pages are off on this machine: {mode.strip()}")
    layout = _layout(16, 4 * MiB, "fill")
    # The first value made in the process has no neighbour above it yet: every one after it has both.
    assert layout["edges_inside"] >= 15, layout
    assert layout["huge"] + 2 * MiB * layout["fallbacks"] >= 15 * 4 * MiB, layout


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
