"""Write-behind from L1 to the L2 tiers through a bounded queue.

SET returns as soon as the chunk is in L1; worker tasks copy it to L2 in threads. The queue is
bounded by items and bytes: when it is full, `submit` waits, so a slow disk slows writers down
instead of growing memory without limit. Chunks still queued stay readable through `pending`.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

Sink = Callable[[bytes, bytes], None]


class WriteBehind:
    """Runs on the event loop thread only (no locks needed); the writes themselves go to threads."""

    def __init__(self, sinks: list[tuple[str, Sink]], max_items: int, max_bytes: int, workers: int) -> None:
        self._sinks = sinks
        self._max_items = max_items
        self._max_bytes = max_bytes
        self._workers_n = workers
        self.pending: dict[bytes, bytes] = {}
        self._order: deque[bytes] = deque()
        self._queued: set[bytes] = set()  # keys in _order
        self._writing: dict[bytes, asyncio.Event] = {}  # keys being written now -> set when done
        self._bytes = 0
        self._in_flight = 0
        self._work = asyncio.Event()  # something is queued (or we are closing)
        self._space = asyncio.Event()  # a slot was freed
        self._progress = asyncio.Event()  # a write finished
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self.written = 0
        self.errors: dict[str, int] = {name: 0 for name, _ in sinks}
        self.last_error: str = ""
        self.failing: dict[str, bool] = {name: False for name, _ in sinks}  # the tier's latest write failed
        self.backpressure_waits = 0

    @property
    def depth(self) -> int:
        return len(self._order) + self._in_flight

    @property
    def queued_bytes(self) -> int:
        return self._bytes

    def start(self) -> None:
        self._tasks = [asyncio.create_task(self._worker(), name=f"write-behind-{i}") for i in range(self._workers_n)]

    def full(self, size: int) -> bool:
        """Would a `size`-byte chunk have to wait?"""
        return self._full(size)

    def _full(self, size: int) -> bool:
        if not self._order:
            return False  # always admit one item, however large, or a big value could never pass
        return len(self._order) >= self._max_items or self._bytes + size > self._max_bytes

    def try_submit(self, key: bytes, value: bytes) -> bool:
        """Queue without waiting; False when the queue is full (then use `submit`)."""
        old = self.pending.get(key)
        if old is not None:  # a newer value replaces the waiting one and keeps its place in line
            self.pending[key] = value
            self._bytes += len(value) - len(old)
            if key not in self._queued:  # the old one is being written now: write the new one after
                self._enqueue(key)
            return True
        if self._full(len(value)):
            return False
        self.pending[key] = value
        self._bytes += len(value)
        self._enqueue(key)
        return True

    def _enqueue(self, key: bytes) -> None:
        self._order.append(key)
        self._queued.add(key)
        self._work.set()

    async def wait_written(self, key: bytes) -> None:
        """Return once no write of `key` is in flight (a DEL must not be undone by a late write)."""
        while (done := self._writing.get(key)) is not None:
            await done.wait()

    async def submit(self, key: bytes, value: bytes) -> None:
        """Queue, waiting while the queue is full: backpressure on the writer."""
        if self.try_submit(key, value):
            return
        self.backpressure_waits += 1
        while True:
            self._space.clear()
            await self._space.wait()
            if self.try_submit(key, value):
                return

    def discard(self, key: bytes) -> None:
        """A DEL before the write happened: drop the queued write."""
        value = self.pending.pop(key, None)
        if value is not None:
            self._bytes -= len(value)
            if key in self._queued:
                self._queued.discard(key)
                self._order.remove(key)
            self._space.set()

    async def _worker(self) -> None:
        while True:
            while not self._order:
                if self._closing:
                    return
                self._work.clear()
                await self._work.wait()
            key = self._order.popleft()
            self._queued.discard(key)
            while key in self._writing:  # an older value of this key is still being written
                await self._writing[key].wait()
            value = self.pending.get(key)
            done = self._writing[key] = asyncio.Event()
            self._in_flight += 1
            self._space.set()  # a slot is free: wake writers held back by backpressure
            try:
                if value is not None:
                    await self._write(key, value)
            finally:
                del self._writing[key]
                done.set()
                self._in_flight -= 1
                if value is not None and self.pending.get(key) is value:
                    del self.pending[key]
                    self._bytes -= len(value)
                self._space.set()
                self._progress.set()

    async def _write(self, key: bytes, value: bytes) -> None:
        for name, sink in self._sinks:
            try:
                await asyncio.to_thread(sink, key, value)
            except Exception as e:
                self.errors[name] += 1
                self.failing[name] = True
                self.last_error = f"{name}: {e}"
                log.warning("write-behind to %s failed for a %d-byte chunk: %s", name, len(value), e)
            else:
                self.written += 1
                self.failing[name] = False

    async def drain(self, timeout: float) -> bool:
        """Wait until everything queued is written; True if it finished within `timeout`."""

        async def _wait() -> None:
            while self._order or self._in_flight:
                self._progress.clear()
                await self._progress.wait()

        try:
            await asyncio.wait_for(_wait(), timeout)
            return True
        except TimeoutError:
            return False

    async def close(self, timeout: float) -> bool:
        drained = await self.drain(timeout)
        self._closing = True
        self._work.set()
        if not drained:
            for task in self._tasks:
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        return drained
