"""One client connection: an asyncio Protocol that parses requests as bytes arrive and runs them in order.

Small commands answered from L1 are answered inside the read callback while nothing is queued ahead; the rest
run in the connection's command task, which yields between turns so that one client's long pipeline or large
reply does not keep the others waiting. What a connection may hold and for how long (`admission`), how requests
and large values come in (`intake`), and how replies go out (`output`, `senders`) live beside it.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import cast

from ..config import LimitsConfig
from ..wire import resp
from ..wire.shared_memory import SharedReply
from ..wire.sockets import widen_unix_send_buffer
from ..wire.valuepool import ValuePool
from .admission import ClientTable, deadline_passed
from .commands import dispatch, dispatch_nowait
from .inflight import InflightBudget
from .intake import LargeValueIntake, ReadGate
from .metrics import Metrics
from .output import WRITE_SLICE, ReplyWriter, reply_size
from .senders import SenderPool
from .state import OUTPUT_BUFFER_LIMIT, UNIX_ADDR, OutputLimitExceeded, Parts, ServerState, Session

log = logging.getLogger(__name__)

SMALL_REPLY = 64
"""Bytes every fast-path reply but a GET's fits in (+OK, an integer): with less room than this left under the
output limit the command goes down the slow path without being run here first."""
_ids = itertools.count(1)

# One connection's turn on the event loop: after this many commands or reply bytes, whichever comes
# first, it lets the other connections run. Without it a client pipelining 100k GETs while reading
# fast kept a PING on another connection waiting for 1-2 s.
_TURN_COMMANDS = 32
_TURN_BYTES = 256 * 1024


@dataclass(frozen=True)
class ServerParts:
    """What the connections of one server share, built once by the server (`listeners.KVServer`): a connection
    depends on these parts, not on the server that owns them and accepts it (no import back from the listeners)."""

    limits: LimitsConfig
    shared_memory: bool
    """`listen.shared_memory`: STRATA.GETFD may hand a value's memory to a client on the Unix socket."""
    state: ServerState
    value_pool: ValuePool
    inflight: InflightBudget
    senders: SenderPool | None
    clients: ClientTable
    metrics: Metrics


class RespConnection(asyncio.BufferedProtocol):
    """One client, from `connection_made` to `connection_lost`: its session, its queue of parsed commands and the
    task that runs them; what it reads goes through `intake`, what it writes through `output`."""

    def __init__(self, parts: ServerParts) -> None:
        self.parts = parts
        limits = parts.limits
        self.parser = resp.RequestParser(
            max_bulk=limits.max_value_size,
            max_args=max(1024, limits.max_pipeline_depth * 2),
            max_request=limits.max_request_size,
            pool=parts.value_pool,
        )
        self.queue: deque[list[bytes] | resp.ProtocolError | resp.CommandRefused] = deque()
        self.transport: asyncio.Transport | None = None
        self.output: ReplyWriter | None = None
        self.session: Session | None = None
        self.work = asyncio.Event()
        self.reading = ReadGate()
        self.intake = LargeValueIntake(self.parser, parts.inflight, self.reading)
        self.broken = False
        self.idle = True  # the command task is waiting, not in the middle of a command
        self.task: asyncio.Task[None] | None = None
        self.pre_auth = parts.state.token is not None  # parsing under the pre-AUTH limits
        if self.pre_auth:
            self.parser.limit_until_authenticated(limits.max_unauthenticated_bulk, limits.max_unauthenticated_args)
        self.connected_at = self.last_active = time.monotonic()
        self.running = False  # inside a command's handler (which may wait on L2 or the write-behind queue)

    # -- asyncio callbacks ------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports do not subclass asyncio's
        parts, state = self.parts, self.parts.state
        self.output = ReplyWriter(self.transport, state, parts.limits.max_output_buffer, parts.senders, self._touch)
        self.reading.transport = self.intake.transport = self.transport
        clients = parts.clients
        clients.connections.add(self)
        state.total_connections += 1
        if not clients.admit(self.pre_auth):
            state.rejected_connections += 1
            self.transport.write(resp.error("max number of clients reached"))
            transport.close()
            return
        peer = transport.get_extra_info("peername")
        addr = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else UNIX_ADDR
        if isinstance(peer, tuple):  # a Unix socket's poll ignores SO_RCVLOWAT
            self.intake.lowat_socket = transport.get_extra_info("socket")
        else:
            widen_unix_send_buffer(transport.get_extra_info("socket"))
        if addr == UNIX_ADDR and parts.shared_memory:
            self.output.hand_over_memory()
        self.session = Session(next(_ids), addr, authenticated=state.token is None)
        state.sessions[self.session.id] = self.session
        if self.pre_auth:
            clients.unauthenticated[self.session.id] = self
        self.task = asyncio.get_running_loop().create_task(self._process())

    def expired(self, now: float) -> str | None:
        """Why this connection should be closed now (`admission.deadline_passed`), or None."""
        if self.session is None:
            return None
        return deadline_passed(self.parts.limits, self.pre_auth, self.connected_at, self.last_active, self.running, now)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self.parser.get_buffer(sizehint)

    def buffer_updated(self, nbytes: int) -> None:
        if self.broken or self.session is None:
            return
        self.parser.buffer_updated(nbytes)
        self._parse()
        self._reserve()
        self.intake.wake_at()

    def _reserve(self) -> None:
        if not self.broken:
            self.intake.reserve()

    def _touch(self) -> None:
        """The client made progress (a request, a reply taken): its idle clock restarts."""
        self.last_active = time.monotonic()

    def _depth(self) -> int:
        """Commands parsed ahead of execution. One before AUTH: what follows AUTH in the same read
        must be parsed under the authenticated limits, so it waits until AUTH has run."""
        return 1 if self.pre_auth else self.parts.limits.max_pipeline_depth

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
                        self.intake.release(cmd)
                        commands, reply_bytes = commands - 1, reply_bytes - size
                        continue
                self.queue.append(cmd)
        except resp.ProtocolError as e:
            self.queue.append(e)
            self.broken = True
        if parsed:
            self.last_active = time.monotonic()
        if len(self.queue) >= depth and self.transport:
            self.reading.set_pipeline_full(True)
        if self.queue:
            self.work.set()

    def _refuse(self, refused: resp.CommandRefused) -> None:
        """A command whose large value got no memory was read to its end: queue its error, free its reservation."""
        self.intake.give_back(refused.value_bytes)
        self.parts.state.values_refused += 1
        log.warning("client %s: %s", self.session.addr if self.session else "?", refused)
        self.queue.append(refused)

    def _run_nowait(self, cmd: list[bytes]) -> int | None:
        """Answer from L1 inside the read callback when nothing is queued ahead: the reply's size, or None: queue it."""
        assert self.output is not None and self.session is not None
        if not self.output.can_write.is_set():
            return None
        # A larger reply is written slice by slice by the command task, letting other connections in between;
        # one past the output limit makes the slow path close the connection and count it.
        room = self.output.room(WRITE_SLICE)
        if room < SMALL_REPLY:
            return None
        started = time.perf_counter()
        try:
            reply = dispatch_nowait(self.parts.state, self.session, cmd, room)
        except Exception:  # the slow path runs it again and turns the failure into an error reply
            log.debug("fast path failed for %r", cmd[0][:32], exc_info=True)
            return None
        if reply is None:
            return None
        assert not isinstance(reply, SharedReply), "memory goes out from the command task only"
        size = reply_size(reply)
        self.output.write_now(reply)
        self.parts.metrics.observe(cmd[0], time.perf_counter() - started)
        return size

    def drop(self, reason: str) -> None:
        """Close the connection for `reason` now, discarding output it has not read; counted in metrics.

        The slot is freed at once: a transport's `close` waits for its buffer to drain, which a
        client that never reads would make last forever, so this aborts instead. Nothing is sent
        first, as Redis does: an unsolicited error would be read as the reply to the next request.
        """
        self.parts.state.disconnections[reason] += 1
        self.broken = True  # parse nothing more from it
        if self.session is not None:
            log.info("closing client %s (id %d): %s", self.session.addr, self.session.id, reason)
        self._forget()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.abort()

    def _forget(self) -> None:
        self.parts.clients.forget(self, None if self.session is None else self.session.id)
        exports = self.parts.state.exports
        if exports is not None and self.session is not None:
            exports.forget(self.session.id)  # what it was handed counts on against the server until let go

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
        self.intake.connection_lost()
        self.parser.release()
        if self.output is not None:
            self.output.connection_lost()

    def pause_writing(self) -> None:
        assert self.output is not None
        self.output.can_write.clear()

    def resume_writing(self) -> None:
        assert self.output is not None
        self.last_active = time.monotonic()  # the client is reading its replies
        self.output.can_write.set()

    # -- command loop -----------------------------------------------------------------------------
    async def _process(self) -> None:
        assert self.transport is not None and self.output is not None and self.session is not None
        transport, output, session, state = self.transport, self.output, self.session, self.parts.state
        metrics = self.parts.metrics
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
                        self.intake.release(item)
                    metrics.observe(item[0], time.perf_counter() - started)
                size = -1 if reply is None else reply_size(reply)
                if reply is None or not output.within_limit(size):
                    self.drop(OUTPUT_BUFFER_LIMIT)
                    return
                if not await output.write(reply):
                    return
                self.last_active = time.monotonic()
                if session.close_after_reply:
                    transport.close()
                    return
                if self.pre_auth and session.authenticated:
                    self._authenticated()
                if self.reading.pipeline_full and len(self.queue) < max(1, self._depth() // 2):
                    self.reading.set_pipeline_full(False)
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
        self.parts.clients.unauthenticated.pop(self.session.id, None)
