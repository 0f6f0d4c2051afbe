"""Receiving requests: when a connection stops reading, and how large values are let in.

Reading stops for two reasons, which `ReadGate` keeps apart so that neither resumes what the other paused: the
pipeline is full (`limits.max_pipeline_depth` commands wait for replies), or a large value waits for room in the
server's in-flight budget (`InflightBudget`). `LargeValueIntake` holds one connection's reservations in that
budget and, on TCP, the socket's low-water mark that lets a large value arrive in few wake-ups (kvserver README,
Receiving large values).
"""

from __future__ import annotations

import asyncio
import socket

from ..wire import resp
from .inflight import InflightBudget

WAKE_AT_MOST = 4 * 1024 * 1024  # SO_RCVLOWAT while a large value arrives: the loop wakes per this much, not per packet
WAKE_TAIL_AT_LEAST = 256 * 1024  # receiving alone, the last 4 MiB wake the loop per half of the rest, down to this


class ReadGate:
    """Reading from the transport, paused while the pipeline is full or a large value waits for budget."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.pipeline_full = False
        self.waiting_budget = False

    def _apply(self, was_open: bool) -> None:
        is_open = not (self.pipeline_full or self.waiting_budget)
        if self.transport is None or is_open == was_open:
            return
        if is_open:
            self.transport.resume_reading()
        else:
            self.transport.pause_reading()

    def set_pipeline_full(self, full: bool) -> None:
        was_open = not (self.pipeline_full or self.waiting_budget)
        self.pipeline_full = full
        self._apply(was_open)

    def set_waiting_budget(self, waiting: bool) -> None:
        was_open = not (self.pipeline_full or self.waiting_budget)
        self.waiting_budget = waiting
        self._apply(was_open)


class LargeValueIntake:
    """One connection's large values in the in-flight budget: reserved when the parser begins one, released when
    its command has run (L1 counts it then) or was refused.

    It is the budget's `Waiter`: `transport` tells the budget whether the connection is still there.
    """

    def __init__(self, parser: resp.RequestParser, budget: InflightBudget, gate: ReadGate) -> None:
        self.parser = parser
        self.budget = budget
        self.gate = gate
        self.transport: asyncio.Transport | None = None
        self.reserved = 0  # bytes of large values this connection holds against the in-flight budget
        self.reserved_values = 0  # how many of the parser's large values are covered
        self.lowat_socket: socket.socket | None = None  # TCP connections: where SO_RCVLOWAT is set (`wake_at`)
        self.lowat = 1

    def reserve(self) -> None:
        """Reserve in-flight memory for a large value the parser has just begun, or stop reading until there is room."""
        if self.gate.waiting_budget or self.parser.big_values_started == self.reserved_values:
            return
        self.reserved_values = self.parser.big_values_started
        want = self.parser.receiving
        if not want:
            return  # begun and finished within this read: already in the parse buffer
        if self.budget.try_reserve(want):
            self.reserved += want
            return
        self.budget.wait(self, want)
        self.gate.set_waiting_budget(True)

    def reservation_granted(self, n: int) -> None:
        self.reserved += n
        self.gate.set_waiting_budget(False)

    def release(self, cmd: list[bytes]) -> None:
        """A command ran: its large values are stored (L1 counts them now) or dropped."""
        if not self.reserved:
            return
        self.give_back(sum(len(a) for a in cmd if resp.is_big(a)))

    def give_back(self, n: int) -> None:
        """Release up to `n` reserved bytes (a refused value's, or a command's)."""
        n = min(self.reserved, n)
        if n:
            self.reserved -= n
            self.budget.release(n)

    def wake_at(self) -> None:
        """While a large value arrives, have the kernel wake the loop only once `WAKE_AT_MOST` of it (or all the
        rest) is there; otherwise at the first byte.

        Woken per batch of packets, the loop took 7 reads and 5 wake-ups per 4 MiB SET here, each read a trip
        through the protocol; with the socket's low-water mark at the rest of the value, 3 and 2, and the server's
        CPU per GB of SETs fell by 32% / 10% / 3% at 4 MiB x1 / x8 / x32 and by 25-47% at 64 MiB (the kvserver
        README). Never above the bytes the value still needs, so a complete request always wakes it (the kernel
        also wakes it on a close, and caps the mark at half its largest receive buffer).

        Waiting for the whole rest, though, leaves the last copy until the client has sent everything: with no
        other large value arriving, that copy is all the client waits for, and a lone client's 4 MiB SETs ran at
        1.46-2.11 GB/s against 2.43-2.63 woken per packet. So a connection receiving alone is woken for the last
        `WAKE_AT_MOST` per half of what is left (down to `WAKE_TAIL_AT_LEAST`), copying while the rest arrives;
        when others' values arrive too, the loop has their work to do meanwhile and fewer wake-ups win.
        """
        sock = self.lowat_socket
        if sock is None:
            return
        remaining = self.parser.big_remaining
        want = min(remaining, WAKE_AT_MOST) if remaining else 1
        if want == remaining and want > WAKE_TAIL_AT_LEAST and self.budget.used <= self.reserved:
            want = max(remaining // 2, WAKE_TAIL_AT_LEAST)
        if want == self.lowat:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
        except OSError:  # not to be had here: woken per packet, as before
            self.lowat_socket = None
            return
        self.lowat = want

    def connection_lost(self) -> None:
        """Leave the budget's queue and give back everything held."""
        self.budget.forget(self)
        if self.reserved:
            self.budget.release(self.reserved)
            self.reserved = 0
