"""Write-behind: bounded by items and bytes (writers wait), failures counted, drain on close."""

import asyncio
import threading

from strata_kv.store.writebehind import WriteBehind


async def test_full_queue_makes_writers_wait_until_the_sink_catches_up() -> None:
    gate = threading.Event()
    written: list[bytes] = []

    def slow_sink(key: bytes, value: bytes) -> None:
        gate.wait(10)
        written.append(key)

    wb = WriteBehind([("fs", slow_sink)], max_items=2, max_bytes=10**9, workers=1)
    wb.start()
    for i in range(3):  # one in flight + two queued
        await wb.submit(b"k%d" % i, b"v")
    blocked = asyncio.create_task(wb.submit(b"k3", b"v"))
    await asyncio.sleep(0.2)
    assert not blocked.done()
    assert wb.backpressure_waits == 2  # k2 waited for the worker to take k0; k3 waits now
    assert b"k3" not in wb.pending
    gate.set()
    await asyncio.wait_for(blocked, 10)
    assert await wb.close(10)
    assert sorted(written) == [b"k0", b"k1", b"k2", b"k3"]
    assert wb.pending == {}


async def test_byte_bound_applies_but_one_huge_value_still_passes() -> None:
    done: list[bytes] = []
    wb = WriteBehind([("fs", lambda k, v: done.append(k))], max_items=100, max_bytes=10, workers=1)
    await wb.submit(b"big", b"x" * 1000)  # larger than the bound, admitted into an empty queue
    wb.start()
    assert await wb.close(10)
    assert done == [b"big"]


async def test_sink_failures_are_counted_and_do_not_stop_the_queue() -> None:
    def failing(key: bytes, value: bytes) -> None:
        raise OSError(28, "No space left on device")

    wb = WriteBehind([("fs", failing)], max_items=10, max_bytes=10**6, workers=2)
    wb.start()
    for i in range(5):
        await wb.submit(b"k%d" % i, b"v")
    assert await wb.close(10)
    assert wb.errors["fs"] == 5
    assert "No space left" in wb.last_error


async def test_pending_values_are_readable_until_written() -> None:
    gate = threading.Event()
    wb = WriteBehind([("fs", lambda k, v: gate.wait(10))], max_items=10, max_bytes=10**6, workers=1)
    wb.start()
    await wb.submit(b"k", b"value")
    assert wb.pending[b"k"] == b"value"
    gate.set()
    assert await wb.close(10)
    assert b"k" not in wb.pending


async def test_overwrite_during_a_write_is_written_after_it() -> None:
    gate = threading.Event()
    log: list[bytes] = []

    def sink(key: bytes, value: bytes) -> None:
        gate.wait(10)
        log.append(value)

    wb = WriteBehind([("fs", sink)], max_items=10, max_bytes=10**6, workers=2)
    wb.start()
    await wb.submit(b"k", b"v1")
    await asyncio.sleep(0.05)  # v1 is in flight now
    await wb.submit(b"k", b"v2")
    gate.set()
    assert await wb.close(10)
    assert log == [b"v1", b"v2"]
    assert wb.pending == {} and wb.queued_bytes == 0


async def test_delete_waits_for_the_write_in_flight() -> None:
    gate = threading.Event()
    wb = WriteBehind([("fs", lambda k, v: gate.wait(10))], max_items=10, max_bytes=10**6, workers=1)
    wb.start()
    await wb.submit(b"k", b"v")
    await asyncio.sleep(0.05)
    wb.discard(b"k")
    waiter = asyncio.create_task(wb.wait_written(b"k"))
    await asyncio.sleep(0.05)
    assert not waiter.done()
    gate.set()
    await asyncio.wait_for(waiter, 10)
    assert await wb.close(10)
