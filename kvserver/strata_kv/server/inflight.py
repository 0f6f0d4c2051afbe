"""The server-wide budget for large values received but not yet stored (`limits.max_inflight_bytes`)."""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Protocol


class Waiter(Protocol):
    """A connection that may wait for a reservation (a connection's `intake.LargeValueIntake`)."""

    transport: asyncio.Transport | None

    def reservation_granted(self, n: int) -> None: ...


class InflightBudget:
    """Bytes of large values received but not yet stored, over all connections, kept under `limit`.

    A connection that starts a large value reserves its announced size before reading its body; when
    that would pass the limit it stops reading and queues here, and gets in, oldest first, as
    stored values release theirs. One value always gets in alone, so a value larger than the
    limit still passes (one at a time). This is what keeps 32 clients writing 64 MiB values at
    once from holding 2 GiB beside L1: what cannot fit waits, in the kernel's socket buffers.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0
        self.waits = 0
        self.waiting: deque[tuple[Waiter, int]] = deque()

    def try_reserve(self, n: int) -> bool:
        if self.used and (self.waiting or self.used + n > self.limit):
            return False
        self.used += n
        self.peak = max(self.peak, self.used)
        return True

    def wait(self, conn: Waiter, n: int) -> None:
        self.waits += 1
        self.waiting.append((conn, n))

    def release(self, n: int) -> None:
        self.used -= n
        while self.waiting:
            conn, want = self.waiting[0]
            if conn.transport is None or conn.transport.is_closing():
                self.waiting.popleft()
                continue
            if self.used and self.used + want > self.limit:
                return
            self.waiting.popleft()
            self.used += want
            self.peak = max(self.peak, self.used)
            conn.reservation_granted(want)

    def forget(self, conn: Waiter) -> None:
        if any(c is conn for c, _ in self.waiting):
            self.waiting = deque((c, n) for c, n in self.waiting if c is not conn)
            self.release(0)
