"""Writing replies: part by part, large parts slice by slice, waiting while the client does not read, within
`limits.max_output_buffer`; a value's memory handed over on the Unix socket; large replies on sender threads.

Kept apart from parsing and commands because its rules come from the socket, not the protocol: what a client
that stops reading may cost (about one part in the transport's buffer), and how long one large reply may hold
the loop (one slice, then a turn for the others).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable, Sequence

from ..wire.shared_memory import SharedReply, send_with_fd
from .senders import OffLoopSender, SenderPool, second_handle
from .state import Parts, ServerState

WRITE_SLICE = 1024 * 1024  # a larger reply is written in slices of this size, with a turn for others after each
WRITE_AHEAD = 4 * WRITE_SLICE  # slices queued beyond what the socket took, so it never waits on the next one


def reply_size(reply: Parts) -> int:
    """Bytes the reply may put in the output buffer (a shared reply's fallback, in case it is sent)."""
    if isinstance(reply, SharedReply):
        reply = reply.fallback
    return len(reply) if isinstance(reply, bytes) else sum(len(part) for part in reply)


class ReplyWriter:
    """One connection's output: the transport, whether it takes more now (`can_write`), and the limit on what
    waits in it."""

    def __init__(
        self,
        transport: asyncio.Transport,
        state: ServerState,
        output_limit: int,
        senders: SenderPool | None,
        on_progress: Callable[[], None],
    ) -> None:
        self.transport = transport
        self.state = state
        self.output_limit = output_limit
        self.senders = senders
        self.sender = None if senders is None else OffLoopSender(senders, transport, on_progress)
        self.fd_socket: socket.socket | None = None  # Unix connections with listen.shared_memory: sends memfds
        self.can_write = asyncio.Event()
        self.can_write.set()
        transport.set_write_buffer_limits(high=WRITE_AHEAD)

    def hand_over_memory(self) -> None:
        """Let replies hand a value's memory over (`listen.shared_memory`, Unix socket): the transports send no
        ancillary data; a second socket object on the same connection does."""
        self.fd_socket = second_handle(self.transport)

    def room(self, most: int) -> int:
        """How many reply bytes may go into the output now, at most `most`: what `limits.max_output_buffer`
        leaves beside what waits in the transport already."""
        if not self.output_limit:
            return most
        return max(0, min(most, self.output_limit - self.transport.get_write_buffer_size()))

    def within_limit(self, size: int) -> bool:
        """Whether `size` more bytes keep this connection's pending output within `limits.max_output_buffer`."""
        if not self.output_limit:
            return True
        return self.transport.get_write_buffer_size() + size <= self.output_limit

    def write_now(self, reply: bytes | list[bytes]) -> None:
        """A small reply, into the transport at once (the fast path, inside the read callback)."""
        if isinstance(reply, bytes):
            self.transport.write(reply)
        else:
            for part in reply:
                self.transport.write(part)

    async def write(self, reply: Parts) -> bool:
        """Write a reply part by part, waiting while the transport holds more than its high-water mark.

        A client that does not read therefore holds at most about one part (one value; views of it, no
        copies) in the transport's buffer, however large the reply, and its next commands wait: without
        the wait an MGET repeating one large key copied the whole reply into memory. Parts stay separate
        writes, so a large value reaches the socket uncopied when it can take it. A part above
        `WRITE_SLICE` goes in slices with a turn for other connections after each: handed over whole, the
        loop's writer kept at it while the socket took it, and a small GET elsewhere waited 73-100 ms behind
        8 streams of 64 MiB here (5-9 ms in 1 MiB slices, 27-38 ms in 4 MiB ones; the price is 10-20% of GET
        throughput, see the kvserver README). With `listen.sender_threads`, a large reply while another is going
        out is sent from a thread instead (`senders`). False: the connection closed meanwhile.
        """
        if isinstance(reply, SharedReply):
            # Only into an empty output buffer, so the header cannot overtake replies queued before it.
            fd_socket = self.fd_socket
            empty = not self.transport.get_write_buffer_size()
            try:
                if fd_socket is not None and empty and send_with_fd(fd_socket, reply.header, reply.handle.fd):
                    self.state.shared_replies += 1
                    return True
            finally:
                reply.handle.close()  # sent (the message holds it now) or not: the server's copy goes
            reply = reply.fallback
        parts = (reply,) if isinstance(reply, bytes) else reply
        pool, sender = self.senders, self.sender
        if pool is None or sender is None or not any(len(part) > WRITE_SLICE for part in parts):
            return await self._write_parts(parts)
        pool.large_replies += 1
        try:
            # A second large reply at once goes to a sender thread; one alone costs less on the loop (no
            # hand-overs), and that is what a single client would pay.
            sock = sender.handle() if pool.large_replies > 1 else None
            if sock is not None and not self.transport.get_write_buffer_size():  # nothing queued it could overtake
                sent = await sender.send(sock, parts)
                if sent:
                    self.state.sender_replies += 1
                return sent
            return await self._write_parts(parts)
        finally:
            pool.large_replies -= 1

    async def _write_parts(self, parts: Sequence[bytes]) -> bool:
        """`write` on the loop: part by part, large parts slice by slice."""
        for part in parts:
            for piece in _slices(part):
                self.transport.write(piece)
                if not self.can_write.is_set():
                    await self.can_write.wait()
                    if self.transport.is_closing():
                        return False
                elif piece is not part:
                    await asyncio.sleep(0)  # the socket took the slice: other connections get their turn
        return True

    def connection_lost(self) -> None:
        self.can_write.set()
        if self.fd_socket is not None:
            self.fd_socket.close()
            self.fd_socket = None
        if self.sender is not None:
            self.sender.connection_lost()


def _slices(part: bytes) -> Sequence[bytes | memoryview]:
    """`part` itself, or, above `WRITE_SLICE`, views of it that slice size each (slices of a view copy nothing)."""
    if len(part) <= WRITE_SLICE:
        return (part,)
    view = memoryview(part)
    return [view[start : start + WRITE_SLICE] for start in range(0, len(view), WRITE_SLICE)]
