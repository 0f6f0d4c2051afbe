"""The asyncio RESP server: TCP and Unix socket listeners, one Protocol per connection.

Each connection parses as bytes arrive and runs commands in order in its own task. Backpressure is
two-sided: reading pauses when `max_pipeline_depth` commands wait for replies, and writing a reply
(and with it command processing) pauses, part by part (large parts slice by slice), while the transport's
write buffer is full.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import itertools
import logging
import os
import resource
import signal
import socket
import stat
import threading
import time
from collections import deque
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import cast

from . import resp
from .commands import dispatch, dispatch_nowait
from .config import KVServerConfig
from .inflight import InflightBudget
from .metrics import Metrics
from .shared_memory import SharedReply, send_with_fd
from .state import (
    AUTH_TIMEOUT,
    IDLE_TIMEOUT,
    OUTPUT_BUFFER_LIMIT,
    UNAUTHENTICATED_EVICTED,
    UNIX_ADDR,
    OutputLimitExceeded,
    Parts,
    ServerState,
    Session,
)
from .store import TieredStore
from .valuepool import ValuePool

log = logging.getLogger(__name__)
_ids = itertools.count(1)

# One connection's turn on the event loop: after this many commands or reply bytes, whichever comes
# first, it lets the other connections run. Without it a client pipelining 100k GETs while reading
# fast kept a PING on another connection waiting for 1-2 s.
_TURN_COMMANDS = 32
_TURN_BYTES = 256 * 1024
_WRITE_SLICE = 1024 * 1024  # a larger reply is written in slices of this size, with a turn for others after each
_WRITE_AHEAD = 4 * _WRITE_SLICE  # slices queued beyond what the socket took, so it never waits on the next one
_WAKE_AT_MOST = 4 * 1024 * 1024  # SO_RCVLOWAT while a large value arrives: the loop wakes per this much, not per packet
_WAKE_TAIL_AT_LEAST = 256 * 1024  # receiving alone, the last 4 MiB wake the loop per half of the rest, down to this
_SEND_CHUNK = 4 * _WRITE_SLICE  # one sender job's most; the connection's next chunk queues behind other jobs
_SEND_VIEWS = 512  # buffers per sendmsg, well under IOV_MAX (1024 on Linux)


MIN_TOKEN_BYTES = 16  # shorter auth tokens get a warning at start


def _reply_size(reply: Parts) -> int:
    """Bytes the reply may put in the output buffer (a shared reply's fallback, in case it is sent)."""
    if isinstance(reply, SharedReply):
        reply = reply.fallback
    return len(reply) if isinstance(reply, bytes) else sum(len(part) for part in reply)


class RespConnection(asyncio.BufferedProtocol):
    def __init__(self, server: KVServer) -> None:
        self.server = server
        limits = server.cfg.limits
        self.parser = resp.RequestParser(
            max_bulk=limits.max_value_size,
            max_args=max(1024, limits.max_pipeline_depth * 2),
            max_request=limits.max_request_size,
            pool=server.value_pool,
        )
        self.queue: deque[list[bytes] | resp.ProtocolError | resp.CommandRefused] = deque()
        self.transport: asyncio.Transport | None = None
        self.session: Session | None = None
        self.work = asyncio.Event()
        self.can_write = asyncio.Event()
        self.can_write.set()
        self.reading_paused = False
        self.broken = False
        self.idle = True  # the command task is waiting, not in the middle of a command
        self.task: asyncio.Task[None] | None = None
        self.pre_auth = server.state.token is not None  # parsing under the pre-AUTH limits
        if self.pre_auth:
            self.parser.limit_until_authenticated(limits.max_unauthenticated_bulk, limits.max_unauthenticated_args)
        self.connected_at = self.last_active = time.monotonic()
        self.running = False  # inside a command's handler (which may wait on L2 or the write-behind queue)
        self.reserved = 0  # bytes of large values this connection holds against the in-flight budget
        self.reserved_values = 0  # how many of the parser's large values are covered
        self.waiting_budget = False
        self.fd_socket: socket.socket | None = None  # Unix connections with listen.shared_memory: sends memfds
        self.send_socket: socket.socket | None = None  # the sender threads' handle on the connection
        self.sending_off_loop = False  # `_send_off_loop` runs; it closes `send_socket` if the connection goes
        self.closed = False
        self.lowat_socket: socket.socket | None = None  # TCP connections: where SO_RCVLOWAT is set (`_wake_at`)
        self.lowat = 1

    # -- asyncio callbacks ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        self.transport.set_write_buffer_limits(high=_WRITE_AHEAD)
        self.server.connections.add(self)
        state = self.server.state
        state.total_connections += 1
        if not self._admit():
            state.rejected_connections += 1
            self.transport.write(resp.error("max number of clients reached"))
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        addr = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else UNIX_ADDR
        if isinstance(peer, tuple):  # a Unix socket's poll ignores SO_RCVLOWAT
            self.lowat_socket = transport.get_extra_info("socket")
        if addr == UNIX_ADDR and self.server.cfg.listen.shared_memory:
            # The transports send no ancillary data; a second socket object on the same connection does.
            self.fd_socket = _second_handle(self.transport)
        self.session = Session(next(_ids), addr, authenticated=state.token is None)
        state.sessions[self.session.id] = self.session
        if self.pre_auth:
            self.server.unauthenticated[self.session.id] = self
        self.task = asyncio.get_running_loop().create_task(self._process())

    def _admit(self) -> bool:
        """Whether a new connection gets a slot; to make room, the oldest unauthenticated one may go.

        Every connection starts unauthenticated, so refusing newcomers once unauthenticated
        connections fill their share (or all of `max_clients`) would let a few silent sockets lock
        every real client out. Closing the oldest of them instead means a client that authenticates
        promptly gets in unless sockets are opened faster than it can send AUTH.
        """
        server, limits = self.server, self.server.cfg.limits
        full = len(server.state.sessions) >= limits.max_clients
        crowded = self.pre_auth and len(server.unauthenticated) >= limits.max_unauthenticated_clients
        if not (full or crowded):
            return True
        if not server.unauthenticated:
            return False
        next(iter(server.unauthenticated.values())).drop(UNAUTHENTICATED_EVICTED)
        return True

    def expired(self, now: float) -> str | None:
        """Why this connection should be closed now (AUTH deadline or idle timeout), or None.

        Idle means: no complete request received, no command finished and no reply progress for
        `idle_timeout_seconds`, and no command running. A client that trickles bytes without
        completing requests, or stops reading its replies, goes idle; one waiting on a long
        command does not.
        """
        limits = self.server.cfg.limits
        if self.session is None:
            return None
        if self.pre_auth and limits.auth_timeout_seconds and now - self.connected_at > limits.auth_timeout_seconds:
            return AUTH_TIMEOUT
        if limits.idle_timeout_seconds and not self.running and now - self.last_active > limits.idle_timeout_seconds:
            return IDLE_TIMEOUT
        return None

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.parser.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self.broken or self.session is None:
            return
        self.parser.buffer_updated(nbytes)
        self._parse()
        self._reserve()
        self._wake_at()

    def _wake_at(self) -> None:
        """While a large value arrives, have the kernel wake the loop only once `_WAKE_AT_MOST` of it (or all the
        rest) is there; otherwise at the first byte.

        Woken per batch of packets, the loop took 7 reads and 5 wake-ups per 4 MiB SET here, each read a trip
        through the protocol; with the socket's low-water mark at the rest of the value, 3 and 2, and the server's
        CPU per GB of SETs fell by 32% / 10% / 3% at 4 MiB x1 / x8 / x32 and by 25-47% at 64 MiB (the kvserver
        README). Never above the bytes the value still needs, so a complete request always wakes it (the kernel
        also wakes it on a close, and caps the mark at half its largest receive buffer).

        Waiting for the whole rest, though, leaves the last copy until the client has sent everything: with no
        other large value arriving, that copy is all the client waits for, and a lone client's 4 MiB SETs ran at
        1.46-2.11 GB/s against 2.43-2.63 woken per packet. So a connection receiving alone is woken for the last
        `_WAKE_AT_MOST` per half of what is left (down to `_WAKE_TAIL_AT_LEAST`), copying while the rest arrives;
        when others' values arrive too, the loop has their work to do meanwhile and fewer wake-ups win.
        """
        sock = self.lowat_socket
        if sock is None:
            return
        remaining = self.parser.big_remaining
        want = min(remaining, _WAKE_AT_MOST) if remaining else 1
        if want == remaining and want > _WAKE_TAIL_AT_LEAST and self.server.inflight.used <= self.reserved:
            want = max(remaining // 2, _WAKE_TAIL_AT_LEAST)
        if want == self.lowat:
            return
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
        except OSError:  # not to be had here: woken per packet, as before
            self.lowat_socket = None
            return
        self.lowat = want

    def _reserve(self) -> None:
        """Reserve in-flight memory for a large value the parser has just begun, or stop reading until there is room."""
        if self.waiting_budget or self.parser.big_values_started == self.reserved_values or self.broken:
            return
        self.reserved_values = self.parser.big_values_started
        want = self.parser.receiving
        if not want:
            return  # begun and finished within this read: already in the parse buffer
        budget = self.server.inflight
        if budget.try_reserve(want):
            self.reserved += want
            return
        self.waiting_budget = True
        budget.wait(self, want)
        if self.transport is not None and not self.reading_paused:
            self.transport.pause_reading()

    def reservation_granted(self, n: int) -> None:
        self.reserved += n
        self.waiting_budget = False
        if self.transport is not None and not self.reading_paused:
            self.transport.resume_reading()

    def _release(self, cmd: list[bytes]) -> None:
        """A command ran: its large values are stored (L1 counts them now) or dropped."""
        if not self.reserved:
            return
        n = min(self.reserved, sum(len(a) for a in cmd if resp.is_big(a)))
        if n:
            self.reserved -= n
            self.server.inflight.release(n)

    def _depth(self) -> int:
        """Commands parsed ahead of execution. One before AUTH: what follows AUTH in the same read
        must be parsed under the authenticated limits, so it waits until AUTH has run."""
        return 1 if self.pre_auth else self.server.cfg.limits.max_pipeline_depth

    def _parse(self) -> None:
        """Take complete commands from the parser: answer them inline while a turn's budget lasts, queue the rest.

        The queued ones run in the command task, which yields between turns, so a long pipeline
        read in one go is not served in one go ahead of every other connection.
        """
        depth = self._depth()
        parsed = False
        commands, reply_bytes = _TURN_COMMANDS, _TURN_BYTES
        try:
            while len(self.queue) < depth:
                try:
                    cmd = self.parser.get_command()
                except resp.CommandRefused as refused:
                    self._refuse(refused)
                    parsed = True
                    continue
                if cmd is None:
                    break
                parsed = True
                if commands > 0 and reply_bytes > 0 and self.idle and not self.queue:
                    size = self._run_nowait(cmd)
                    if size is not None:
                        self._release(cmd)
                        commands, reply_bytes = commands - 1, reply_bytes - size
                        continue
                self.queue.append(cmd)
        except resp.ProtocolError as e:
            self.queue.append(e)
            self.broken = True
        if parsed:
            self.last_active = time.monotonic()
        if len(self.queue) >= depth and not self.reading_paused and self.transport:
            self.transport.pause_reading()
            self.reading_paused = True
        if self.queue:
            self.work.set()

    def _refuse(self, refused: resp.CommandRefused) -> None:
        """A command whose large value got no memory was read to its end: queue its error, free its reservation."""
        n = min(self.reserved, refused.value_bytes)
        if n:
            self.reserved -= n
            self.server.inflight.release(n)
        self.server.state.values_refused += 1
        log.warning("client %s: %s", self.session.addr if self.session else "?", refused)
        self.queue.append(refused)

    def _run_nowait(self, cmd: list[bytes]) -> int | None:
        """Answer from L1 inside the read callback when nothing is queued ahead: the reply's size, or None: queue it."""
        assert self.transport is not None and self.session is not None
        if not self.can_write.is_set():
            return None
        started = time.perf_counter()
        try:
            reply = dispatch_nowait(self.server.state, self.session, cmd)
        except Exception:  # the slow path runs it again and turns the failure into an error reply
            log.debug("fast path failed for %r", cmd[0][:32], exc_info=True)
            return None
        if reply is None or isinstance(reply, SharedReply):  # memory goes out from the command task only
            return None
        size = _reply_size(reply)
        if size > _WRITE_SLICE:
            return None  # the command task writes it slice by slice, letting other connections in between
        if not self._within_output_limit(size):
            return None  # the slow path closes the connection and counts it
        if isinstance(reply, bytes):
            self.transport.write(reply)
        else:
            for part in reply:
                self.transport.write(part)
        self.server.metrics.observe(cmd[0], time.perf_counter() - started)
        return size

    def _within_output_limit(self, size: int) -> bool:
        """Whether `size` more bytes keep this connection's pending output within `limits.max_output_buffer`."""
        limit = self.server.cfg.limits.max_output_buffer
        if not limit:
            return True
        assert self.transport is not None
        return self.transport.get_write_buffer_size() + size <= limit

    def drop(self, reason: str) -> None:
        """Close the connection for `reason` now, discarding output it has not read; counted in metrics.

        The slot is freed at once: a transport's `close` waits for its buffer to drain, which a
        client that never reads would make last forever, so this aborts instead. Nothing is sent
        first, as Redis does: an unsolicited error would be read as the reply to the next request.
        """
        self.server.state.disconnections[reason] += 1
        self.broken = True  # parse nothing more from it
        if self.session is not None:
            log.info("closing client %s (id %d): %s", self.session.addr, self.session.id, reason)
        self._forget()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def _forget(self) -> None:
        """Give the connection's slot back: it no longer counts against `max_clients`."""
        self.server.connections.discard(self)
        if self.session is not None:
            self.server.state.sessions.pop(self.session.id, None)
            self.server.unauthenticated.pop(self.session.id, None)

    def connection_lost(self, exc: Exception | None) -> None:
        """Forget the connection and give its memory back now.

        The command task's frame refers to this object; once cancelled, its traceback does too, so
        holding the task here would make a cycle only the cyclic collector frees, and that runs on
        object counts, not bytes. Dropping the task and the parser's buffers breaks it.
        """
        self._forget()
        if self.task is not None:
            self.task.cancel()
            self.task = None
        self.queue.clear()
        self.server.inflight.forget(self)
        if self.reserved:
            self.server.inflight.release(self.reserved)
            self.reserved = 0
        self.parser.release()
        self.can_write.set()
        self.closed = True
        if self.fd_socket is not None:
            self.fd_socket.close()
            self.fd_socket = None
        if self.send_socket is not None and not self.sending_off_loop:
            self.send_socket.close()
            self.send_socket = None

    def pause_writing(self) -> None:
        self.can_write.clear()

    def resume_writing(self) -> None:
        self.last_active = time.monotonic()  # the client is reading its replies
        self.can_write.set()

    # -- command loop -----------------------------------------------------------------------------
    async def _process(self) -> None:
        assert self.transport is not None and self.session is not None
        transport, session, state = self.transport, self.session, self.server.state
        metrics = self.server.metrics
        while True:
            self.idle = True
            await self.work.wait()
            self.work.clear()
            self.idle = False
            commands, reply_bytes = _TURN_COMMANDS, _TURN_BYTES
            while self.queue:
                item = self.queue.popleft()
                if isinstance(item, resp.ProtocolError):
                    transport.write(resp.error(str(item)))
                    transport.close()
                    return
                reply: Parts | None
                if isinstance(item, resp.CommandRefused):
                    reply = resp.error(str(item))  # its reservation went when it was read (`_refuse`)
                else:
                    started = time.perf_counter()
                    self.running = True
                    try:
                        reply = await dispatch(state, session, item)
                    except asyncio.CancelledError:
                        raise
                    except OutputLimitExceeded:
                        reply = None
                    except Exception as e:
                        log.exception("command %r failed", item[0][:32])
                        reply = resp.error(f"internal error in {item[0][:32].decode(errors='replace')}: {e}")
                    finally:
                        self.running = False
                        self._release(item)
                    metrics.observe(item[0], time.perf_counter() - started)
                size = -1 if reply is None else _reply_size(reply)
                if reply is None or not self._within_output_limit(size):
                    self.drop(OUTPUT_BUFFER_LIMIT)
                    return
                if not await self._write(reply):
                    return
                self.last_active = time.monotonic()
                if session.close_after_reply:
                    transport.close()
                    return
                if self.pre_auth and session.authenticated:
                    self._authenticated()
                if self.reading_paused and len(self.queue) < max(1, self._depth() // 2):
                    self.reading_paused = False
                    if not self.waiting_budget:
                        transport.resume_reading()
                    self._parse()
                    self._reserve()
                commands, reply_bytes = commands - 1, reply_bytes - size
                if commands <= 0 or reply_bytes <= 0:  # end of this connection's turn
                    await asyncio.sleep(0)
                    commands, reply_bytes = _TURN_COMMANDS, _TURN_BYTES

    def _authenticated(self) -> None:
        """AUTH succeeded: the configured limits apply, and the connection leaves the unauthenticated share."""
        assert self.session is not None
        self.pre_auth = False
        self.parser.authenticated()
        self.server.unauthenticated.pop(self.session.id, None)

    async def _write(self, reply: Parts) -> bool:
        """Write a reply part by part, waiting while the transport holds more than its high-water mark.

        A client that does not read therefore holds at most about one part (one value; views of it, no
        copies) in the transport's buffer, however large the reply, and its next commands wait: without
        the wait an MGET repeating one large key copied the whole reply into memory. Parts stay separate
        writes, so a large value reaches the socket uncopied when it can take it. A part above
        `_WRITE_SLICE` goes in slices with a turn for other connections after each: handed over whole, the
        loop's writer kept at it while the socket took it, and a small GET elsewhere waited 73-100 ms behind
        8 streams of 64 MiB here (5-9 ms in 1 MiB slices, 27-38 ms in 4 MiB ones; the price is 10-20% of GET
        throughput, see the kvserver README). With `listen.sender_threads`, a large reply while another is going
        out is sent from a thread instead (`_send_off_loop`). False: the connection closed meanwhile.
        """
        assert self.transport is not None
        if isinstance(reply, SharedReply):
            # Only into an empty output buffer, so the header cannot overtake replies queued before it.
            fd_socket = self.fd_socket
            empty = not self.transport.get_write_buffer_size()
            if fd_socket is not None and empty and send_with_fd(fd_socket, reply.header, reply.fd):
                self.server.state.shared_replies += 1
                return True
            reply = reply.fallback
        parts = (reply,) if isinstance(reply, bytes) else reply
        server = self.server
        if server.senders is None or not any(len(part) > _WRITE_SLICE for part in parts):
            return await self._write_parts(parts)
        server.large_replies += 1
        try:
            # A second large reply at once goes to a sender thread when there are any; one alone costs less
            # on the loop (no hand-overs), and that is what a single client would pay.
            sock = self._sender_socket() if server.senders is not None and server.large_replies > 1 else None
            if sock is not None and not self.transport.get_write_buffer_size():  # nothing queued it could overtake
                return await self._send_off_loop(sock, parts)
            return await self._write_parts(parts)
        finally:
            server.large_replies -= 1

    async def _write_parts(self, parts: Sequence[bytes]) -> bool:
        """`_write` on the loop: part by part, large parts slice by slice."""
        assert self.transport is not None
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

    def _sender_socket(self) -> socket.socket | None:
        """A second handle on the connection's socket for the sender threads (None: the transport has none)."""
        if self.send_socket is None:
            assert self.transport is not None
            self.send_socket = _second_handle(self.transport)
        return self.send_socket

    async def _send_off_loop(self, sock: socket.socket, parts: Sequence[bytes]) -> bool:
        """Send a reply with a large part from the server's sender threads (`listen.sender_threads`),
        `_SEND_CHUNK` at most per job.

        The kernel's copy into the socket is most of a large GET's cost and runs without the GIL, so on sender
        threads large replies to several clients go out on several cores while the loop goes on parsing. When
        the socket is full the connection waits for room on the loop, holding no thread. Called only with the
        transport's buffer empty, so nothing queued there is overtaken, and the command task (busy with this
        reply) writes nothing meanwhile. Measured on 2 shared cores, the cores this takes are the clients', and
        threads the OS deschedules while they hold the GIL hold up the loop: see `listen.sender_threads`.
        False: the connection is gone.
        """
        assert self.server.senders is not None
        loop = asyncio.get_running_loop()
        pending = [memoryview(part) for part in parts]
        job: concurrent.futures.Future[int] | None = None
        self.sending_off_loop = True
        try:
            while pending:
                chunk = _take(pending, _SEND_CHUNK)
                job = self.server.senders.submit(_send_until_full, sock, chunk)
                sent = await asyncio.wrap_future(job)
                pending = _advance(pending, sent)
                if sent:
                    self.last_active = time.monotonic()  # the client is reading
                if pending and sent < sum(len(view) for view in chunk):
                    await _writable(loop, sock.fileno())
            self.server.state.sender_replies += 1
            return True
        except OSError:  # reset or broken pipe: the transport reports the loss too
            return False
        finally:
            self.sending_off_loop = False
            if self.closed:  # connection_lost left the socket to this: close it once no thread uses it
                _close_when_done(sock, job)
                self.send_socket = None


def usable_cpus(cgroup: Path = Path("/sys/fs/cgroup/cpu.max")) -> int:
    """The CPUs this process may run on (its affinity), fewer where its cgroup's CPU quota (a container's CPU
    limit, cgroup v2 `cpu.max`: "<quota> <period>" or "max <period>") allows less."""
    cpus = len(os.sched_getaffinity(0))
    try:
        quota, period = cgroup.read_text().split()[:2]
        if quota == "max":
            return cpus
        return max(1, min(cpus, -(-int(quota) // int(period))))
    except (OSError, ValueError, ZeroDivisionError):
        return cpus


SENDER_NICE = 10
"""How much less CPU a sender thread asks for than the event loop (Linux nice, per thread)."""


def _yield_to_the_loop() -> None:
    """A sender thread's start: run at nice `SENDER_NICE`, so where cores are short the loop, which answers every
    other connection, runs first and the senders take what is left. Interleaved on 2 shared cores (4 rounds, 2
    threads, medians), a small GET's p99 beside 8 clients' GETs went from 15.3 to 11.0 ms at 4 MiB and from 24.9 to
    16.5 ms at 64 MiB, at the same GB/s within the rounds' spread (the loop alone: 8.4 and 10.0 ms). Where the
    system refuses (no per-thread priorities), the thread runs at the loop's."""
    with contextlib.suppress(OSError, AttributeError):
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SENDER_NICE)


def _second_handle(transport: asyncio.BaseTransport) -> socket.socket | None:
    """A socket object of its own on the transport's connection (a dup of its fd), or None: it has no socket."""
    sock = transport.get_extra_info("socket")
    return None if sock is None else socket.socket(fileno=os.dup(sock.fileno()))


def _take(views: list[memoryview], limit: int) -> list[memoryview]:
    """The first `limit` bytes of `views` (at most `_SEND_VIEWS` of them), as views."""
    out: list[memoryview] = []
    for view in views[:_SEND_VIEWS]:
        if len(view) >= limit:
            out.append(view[:limit])
            break
        out.append(view)
        limit -= len(view)
    return out


def _advance(views: list[memoryview], n: int) -> list[memoryview]:
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
            views = _advance(views, n)
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


def _slices(part: bytes) -> Sequence[bytes | memoryview]:
    """`part` itself, or, above `_WRITE_SLICE`, views of it that slice size each (slices of a view copy nothing)."""
    if len(part) <= _WRITE_SLICE:
        return (part,)
    view = memoryview(part)
    return [view[start : start + _WRITE_SLICE] for start in range(0, len(view), _WRITE_SLICE)]


def _raise_open_file_limit() -> None:
    """Each memfd-backed value holds two descriptors; take the hard limit (out of them, values stay inline)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    log.info("open file limit %d (listen.shared_memory: two per large value)", hard)


class KVServer:
    """Owns the store, the listeners and the metrics endpoint; `run` serves until SIGTERM/SIGINT."""

    def __init__(self, cfg: KVServerConfig) -> None:
        self.cfg = cfg
        self.store = TieredStore(cfg)
        self.state = ServerState(store=self.store, token=_read_token(cfg.auth.token_file))
        self.metrics = Metrics(self.state)
        self.inflight = InflightBudget(cfg.inflight_budget)
        # Recycled buffers: at most another in-flight budget; memfd-backed when values may be handed over as memory.
        self.value_pool = ValuePool(cfg.inflight_budget, shared=cfg.listen.shared_memory)
        self.store.l1.on_drop = self.value_pool.give
        self.state.value_pool = self.value_pool
        self.state.inflight = self.inflight
        senders = cfg.listen.sender_threads
        self.senders = (
            ThreadPoolExecutor(senders, thread_name_prefix="strata-kv-send", initializer=_yield_to_the_loop)
            if senders
            else None
        )
        cpus = usable_cpus() if senders else 0
        if senders and senders + 1 > cpus:
            log.warning(
                "listen.sender_threads is %d but this server may use %d CPUs: the threads and the event loop will "
                "share cores, which costs every other client latency (kvserver README, Sender threads); give the "
                "server %d CPUs or set fewer threads",
                senders,
                cpus,
                senders + 1,
            )
        self.large_replies = 0  # with sender threads: replies with a part above `_WRITE_SLICE` going out now
        self._servers: list[asyncio.Server] = []
        self.connections: set[RespConnection] = set()
        self.unauthenticated: dict[int, RespConnection] = {}  # by session id, oldest first
        self._reaper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=32, thread_name_prefix="strata-kv-io"))
        if self.cfg.metrics.port >= 0:
            await self.metrics.start(self.cfg.metrics.bind, self.cfg.metrics.port)
        await self.store.start()
        limits = self.cfg.limits
        timeouts = [limits.idle_timeout_seconds]
        if self.state.token is not None:
            timeouts.append(limits.auth_timeout_seconds)
        timeouts = [t for t in timeouts if t > 0]
        if timeouts:
            self._reaper = loop.create_task(self._reap(max(0.05, min(1.0, min(timeouts) / 4))))
        listen = self.cfg.listen
        if listen.shared_memory:
            _raise_open_file_limit()
        if listen.tcp_enabled:
            srv = await loop.create_server(
                lambda: RespConnection(self), listen.bind, listen.port, reuse_address=True, backlog=1024
            )
            self._servers.append(srv)
            self.state.tcp_port = srv.sockets[0].getsockname()[1]
        if listen.unix_socket:
            path = Path(listen.unix_socket)
            if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
                path.unlink()  # left over from a killed server
            srv = await loop.create_unix_server(lambda: RespConnection(self), str(path), backlog=1024)
            os.chmod(path, listen.unix_socket_mode)
            self._servers.append(srv)
            self.state.unix_socket = str(path)
        log.info(
            "strata-kv ready tcp=%s:%d unix=%s metrics=%d",
            listen.bind,
            self.state.tcp_port,
            self.state.unix_socket or "-",
            self.metrics.port if self.cfg.metrics.port >= 0 else -1,
        )

    async def _reap(self, interval: float) -> None:
        """Close connections past the AUTH deadline or idle too long, checked every `interval` seconds.

        One sweep over all connections (like Redis' clientsCron) costs less than a timer per
        connection re-armed on every request.
        """
        while True:
            await asyncio.sleep(interval)
            now = time.monotonic()
            for conn in list(self.connections):
                try:
                    if reason := conn.expired(now):
                        conn.drop(reason)
                except Exception:  # one odd connection must not end the sweeps for all the others
                    log.exception("checking a connection's deadlines failed")

    async def stop(self) -> None:
        """Stop accepting, let connections finish, drain write-behind to L2, then close."""
        if self._reaper is not None:
            self._reaper.cancel()
        for srv in self._servers:
            srv.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.close()
        drained = await self.store.close()
        await self.metrics.stop()
        if self.senders is not None:
            self.senders.shutdown(wait=False)
        if self.state.unix_socket:
            Path(self.state.unix_socket).unlink(missing_ok=True)
        log.info("strata-kv stopped (write-behind %s)", "drained" if drained else "NOT fully drained")

    async def run(self) -> None:
        await self.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("strata-kv shutting down")
        await self.stop()


def _read_token(path: str | None) -> bytes | None:
    if not path:
        return None
    try:
        token = Path(path).read_bytes().strip()
    except OSError as e:
        raise SystemExit(f"cannot read auth token file {path}: {e.strerror}; mount the Secret or drop auth") from e
    if not token:
        raise SystemExit(f"auth token file {path} is empty; put the token in it or drop auth.token_file")
    if len(token) < MIN_TOKEN_BYTES:
        log.warning(
            "the auth token in %s is %d bytes, shorter than %d: it can be guessed; use a random one "
            "(e.g. `openssl rand -hex 32`)",
            path,
            len(token),
            MIN_TOKEN_BYTES,
        )
    return token
