"""Where large values lie in memory, and how their mappings are recycled: real mappings, no server."""

from __future__ import annotations

import ctypes
import mmap

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


def test_a_large_mapping_starts_on_a_huge_page_boundary_though_a_few_bytes_longer() -> None:
    """Rounded up to 2 MiB and shrunk back in place: Linux aligns only mappings of whole 2 MiB multiples."""
    view = value_buffer(4 * MiB, shared=False)
    start = _address(view) - len(b"$4194304\r\n")
    assert start % (2 * MiB) == 0
    assert isinstance(view.obj, mmap.mmap) and len(view.obj) == 4 * MiB + 10


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
