"""Sender threads (`listen.sender_threads`, off by default): large replies sent from threads instead of the loop.

The kernel's copy into the socket is most of a large GET's cost and runs without the GIL, so on sender threads
large replies to several clients go out on several cores while the loop goes on parsing. Measured on 2 shared
cores, the cores this takes are the clients', and threads the OS deschedules while they hold the GIL hold up the
loop: see `listen.sender_threads` and the kvserver README. `SenderPool` is the server's threads; `OffLoopSender`
is one connection's use of them (a second handle on its socket, and closing it only once no thread uses it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor

from .cpus import usable_cpus

log = logging.getLogger(__name__)

SEND_CHUNK = 4 * 1024 * 1024  # one sender job's most; the connection's next chunk queues behind other jobs
SEND_VIEWS = 512  # buffers per sendmsg, well under IOV_MAX (1024 on Linux)

SENDER_NICE = 10
"""How much less CPU a sender thread asks for than the event loop: added to the loop's nice value (Linux nice, per
thread), up to the lowest priority there is (`LOWEST_NICE`)."""
LOWEST_NICE = 19


class SenderPool:
    """The server's sender threads, and how many large replies are going out now (a second one at once is what
    goes to a thread: one alone costs less on the loop, with no hand-overs)."""

    def __init__(self, threads: int) -> None:
        self.executor = ThreadPoolExecutor(threads, thread_name_prefix="strata-kv-send", initializer=_yield_to_the_loop)
        self.large_replies = 0  # replies with a part above the write slice going out now
        cpus = usable_cpus()
        if threads + 1 > cpus:
            log.warning(
                "listen.sender_threads is %d but this server may use %d CPUs: the threads and the event loop will "
                "share cores, which costs every other client latency (kvserver README, Sender threads); give the "
                "server %d CPUs or set fewer threads",
                threads,
                cpus,
                threads + 1,
            )

    def shutdown(self) -> None:
        self.executor.shutdown(wait=False)


class OffLoopSender:
    """One connection's sends on the pool: a second handle on its socket, made on first use."""

    def __init__(self, pool: SenderPool, transport: asyncio.BaseTransport, on_progress: Callable[[], None]) -> None:
        self.pool = pool
        self.transport = transport
        self.on_progress = on_progress  # the client is reading: its idle clock restarts
        self.sock: socket.socket | None = None
        self.sending = False  # `send` runs; it closes `sock` if the connection goes meanwhile
        self.closed = False

    def handle(self) -> socket.socket | None:
        """The threads' handle on the connection's socket (None: the transport has none)."""
        if self.sock is None:
            self.sock = second_handle(self.transport)
        return self.sock

    async def send(self, sock: socket.socket, parts: Sequence[bytes]) -> bool:
        """Send a reply with a large part from the sender threads, `SEND_CHUNK` at most per job.

        When the socket is full the connection waits for room on the loop, holding no thread. Called only with the
        transport's buffer empty, so nothing queued there is overtaken, and the command task (busy with this
        reply) writes nothing meanwhile. False: the connection is gone.
        """
        loop = asyncio.get_running_loop()
        pending = [memoryview(part) for part in parts]
        job: concurrent.futures.Future[int] | None = None
        self.sending = True
        try:
            while pending:
                chunk = take(pending, SEND_CHUNK)
                job = self.pool.executor.submit(_send_until_full, sock, chunk)
                sent = await asyncio.wrap_future(job)
                pending = advance(pending, sent)
                if sent:
                    self.on_progress()
                if pending and sent < sum(len(view) for view in chunk):
                    await _writable(loop, sock.fileno())
            return True
        except OSError:  # reset or broken pipe: the transport reports the loss too
            return False
        finally:
            self.sending = False
            if self.closed:  # `connection_lost` left the socket to this: close it once no thread uses it
                _close_when_done(sock, job)
                self.sock = None

    def connection_lost(self) -> None:
        """The connection is gone: close the handle now, or leave it to a send in progress. Nobody's idle clock
        is left to restart, and dropping the callback leaves no cycle back to the connection for the collector."""
        self.closed = True
        self.on_progress = _nothing
        if self.sock is not None and not self.sending:
            self.sock.close()
            self.sock = None


def _nothing() -> None:
    pass


def second_handle(transport: asyncio.BaseTransport) -> socket.socket | None:
    """A socket object of its own on the transport's connection (a dup of its fd), or None: it has no socket."""
    sock = transport.get_extra_info("socket")
    return None if sock is None else socket.socket(fileno=os.dup(sock.fileno()))


def _yield_to_the_loop() -> None:
    """A sender thread's start: run at nice `SENDER_NICE`, so where cores are short the loop, which answers every
    other connection, runs first and the senders take what is left. Interleaved on 2 shared cores (4 rounds, 2
    threads, medians), a small GET's p99 beside 8 clients' GETs went from 15.3 to 11.0 ms at 4 MiB and from 24.9 to
    16.5 ms at 64 MiB, at the same GB/s within the rounds' spread (the loop alone: 8.4 and 10.0 ms). Where the
    system refuses (no per-thread priorities), the thread runs at the loop's.

    Relative to the nice value the thread started with (the loop's: a new thread inherits its creator's), never an
    absolute one: a server started at nice 15 (a pod's priority, `nice` on a shared host) would otherwise raise its
    senders above its loop where it may (root), the opposite of the point."""
    with contextlib.suppress(OSError, AttributeError):
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, min(LOWEST_NICE, os.getpriority(os.PRIO_PROCESS, tid) + SENDER_NICE))


def take(views: list[memoryview], limit: int) -> list[memoryview]:
    """The first `limit` bytes of `views` (at most `SEND_VIEWS` of them), as views."""
    out: list[memoryview] = []
    for view in views[:SEND_VIEWS]:
        if len(view) >= limit:
            out.append(view[:limit])
            break
        out.append(view)
        limit -= len(view)
    return out


def advance(views: list[memoryview], n: int) -> list[memoryview]:
    """`views` less their first `n` bytes."""
    first = 0
    while first < len(views) and n >= len(views[first]):
        n -= len(views[first])
        first += 1
    rest = views[first:]
    if n:
        rest[0] = rest[0][n:]
    return rest


def _send_until_full(sock: socket.socket, views: list[memoryview]) -> int:
    """On a sender thread: send `views` until all went or the socket is full; the bytes sent."""
    sent = 0
    try:
        while views:
            n = sock.sendmsg(views)
            sent += n
            views = advance(views, n)
    except (BlockingIOError, InterruptedError):
        pass
    return sent


async def _writable(loop: asyncio.AbstractEventLoop, fd: int) -> None:
    """Wait until the socket `fd` has room to send."""
    room: asyncio.Future[None] = loop.create_future()

    def ready() -> None:
        if not room.done():
            room.set_result(None)

    loop.add_writer(fd, ready)
    try:
        await room
    finally:
        loop.remove_writer(fd)


def _close_when_done(sock: socket.socket, job: concurrent.futures.Future[int] | None) -> None:
    """Close `sock` now, or once the sender thread's `job` on it is done (closed under it, its fd could be reused)."""
    if job is None or job.done():
        sock.close()
    else:
        job.add_done_callback(lambda _: sock.close())
