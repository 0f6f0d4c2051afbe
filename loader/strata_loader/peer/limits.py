"""What one `serve-peer` spends on connections, and how it stays within that when clients are slow or hostile.

Anyone who reaches the peer port can open connections; only fetchers with the token may start a transfer. So a
thread is spent only on a token holder's request, never on a connection:
- one thread (`Doorman`) holds every open connection while its request head arrives (the first, or the next
  one on a kept-alive connection), with one deadline for the whole head (`header_timeout_s`: a byte every few
  seconds does not keep a connection) and at most `HEAD_LIMIT` bytes;
- a complete head that carries the token gets a thread for that one request (`max_requests` at once; past
  that, 503 Retry-After); everything else (the health probe, the proof, /metrics, a refusal) is answered by
  the doorman itself, a few hundred bytes computed at once, so no number of unauthenticated clients can keep
  a token holder's request from a thread;
- open connections are capped in all (`max_connections`) and per client address
  (`max_connections_per_client`); a new one past either cap closes the connection that has waited longest for
  its head (of that address, or of all), never one being served. Slow connections from many addresses so
  push out each other: a fetcher's head arrives within a round trip of its connect, and it is pushed out only
  if `max_connections` more connections arrive in that time;
- a transfer slot (`max_transfers`) is taken by an authenticated file request only, for that request.
"""

from __future__ import annotations

import collections
import contextlib
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 16
DEFAULT_MAX_REQUESTS = 128
DEFAULT_MAX_TRANSFERS = 64
DEFAULT_HEADER_TIMEOUT_S = 10.0
HEAD_LIMIT = 8192
"""Bytes a request head may take (request line and headers); a longer one is answered 431 and closed."""


@dataclass(frozen=True)
class PeerLimits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections open at once; those waiting for a request head cost no thread (one holds them all)."""
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    """Of those, from one client address (a fetcher keeps at most 5 open to one peer)."""
    max_requests: int = DEFAULT_MAX_REQUESTS
    """Token holders' requests served at once, a thread each; one more is answered 503 Retry-After."""
    max_transfers: int = DEFAULT_MAX_TRANSFERS
    """File ranges sent at once; one more is answered 503 Retry-After and the fetcher tries another peer."""
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    """The whole request head must arrive within this (it also closes a kept-alive connection left idle)."""
    send_timeout_s: float = 30.0
    """An answer whose reader stops reading this long is abandoned (and its transfer slot freed)."""

    def check(self) -> None:
        for name in ("max_connections", "max_connections_per_client", "max_requests", "max_transfers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")
        if not self.header_timeout_s > 0:
            raise ValueError(f"--header-timeout {self.header_timeout_s}: must be more than 0 seconds")


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    address: tuple[str, int]
    since: float = 0.0
    """When it began waiting for its current request head."""
    head: bytearray = field(default_factory=bytearray)

    @property
    def client(self) -> str:
        return self.address[0]


Answer = Callable[[Connection, bytes], tuple[bytes, bool]]
"""Answers an unauthenticated request head at once: (the whole response, keep the connection)."""
Serve = Callable[[Connection, bytes], bool]
"""Serves a token holder's request on a blocking socket; True to keep the connection for the next request."""
Authorized = Callable[[bytes], bool]
"""Whether a complete request head carries the token (and asks for something only a token holder gets)."""


class Doorman:
    """One thread that holds every connection between requests, reads request heads, answers what needs no
    token itself and hands a token holder's request to a thread of its own (`limits` above)."""

    def __init__(self, limits: PeerLimits, authorized: Authorized, answer: Answer, serve: Serve) -> None:
        self.limits = limits
        self._authorized, self._answer, self._serve = authorized, answer, serve
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._arrived: collections.deque[tuple[Connection, bool | None]] = collections.deque()
        self._waiting: dict[Connection, None] = {}  # oldest wait first
        self._by_client: collections.Counter[str] = collections.Counter()
        self.open = 0
        self.serving = 0
        self.closed: collections.Counter[str] = collections.Counter()
        """Connections closed by a limit, by reason: header_timeout, client_share, full, head_too_long."""
        self.busy = 0
        """Token holders' requests answered 503 because `max_requests` were being served."""
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="strata-peer-doorman", daemon=True)
        self._thread.start()

    # -- from other threads ----------------------------------------------------------------------------------
    def add(self, sock: socket.socket, address: tuple[str, int]) -> None:
        """A connection just accepted."""
        self._post(Connection(sock, (str(address[0]), int(address[1]))), None)

    def close(self) -> None:
        self._stopped = True
        self._wake()
        self._thread.join(timeout=5)

    def _post(self, conn: Connection, keep: bool | None) -> None:
        """Hand `conn` to the doorman's thread: new (None), or back from a request (keep it or not)."""
        with self._lock:
            self._arrived.append((conn, keep))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full wake-up pipe: the thread is awake already
            self._wake_w.send(b"\0")

    # -- the doorman's thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stopped:
            oldest = next(iter(self._waiting), None)
            timeout = (
                1.0 if oldest is None else max(0.0, oldest.since + self.limits.header_timeout_s - time.monotonic())
            )
            for key, _ in self._selector.select(timeout):
                if key.fileobj is self._wake_r:
                    self._take_arrivals()
                else:
                    self._read(key.data)
            self._expire()
        for conn in list(self._waiting):
            self._close(conn)
        with self._lock:
            for conn, _ in self._arrived:
                conn.sock.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _take_arrivals(self) -> None:
        with contextlib.suppress(OSError):
            while self._wake_r.recv(4096):
                pass
        with self._lock:
            arrived, self._arrived = list(self._arrived), collections.deque()
        for conn, keep in arrived:
            if keep is None:
                self._admit(conn)
            else:
                self._returned(conn, keep)

    def _admit(self, conn: Connection) -> None:
        """Count a new connection in, making room by closing the longest-waiting one of its address, or of all."""
        crowded = self._by_client[conn.client] >= self.limits.max_connections_per_client
        if crowded and not self._push_out(conn.client, "client_share"):
            conn.sock.close()  # every one of its connections is being served: this one waits for none
            self.closed["client_share"] += 1
            return
        if self.open >= self.limits.max_connections and not self._push_out(None, "full"):
            conn.sock.close()
            self.closed["full"] += 1
            return
        self.open += 1
        self._by_client[conn.client] += 1
        self._wait(conn)

    def _push_out(self, client: str | None, reason: str) -> bool:
        victim = next((c for c in self._waiting if client is None or c.client == client), None)
        if victim is None:
            return False
        self._close(victim)
        self.closed[reason] += 1
        return True

    def _wait(self, conn: Connection) -> None:
        conn.since = time.monotonic()
        conn.sock.setblocking(False)
        self._waiting[conn] = None
        self._selector.register(conn.sock, selectors.EVENT_READ, conn)
        if b"\r\n\r\n" in conn.head:  # pipelined: the next head came with the last request
            self._complete(conn)

    def _unwait(self, conn: Connection) -> None:
        if self._waiting.pop(conn, 0) is None:
            self._selector.unregister(conn.sock)

    def _close(self, conn: Connection) -> None:
        self._unwait(conn)
        conn.sock.close()
        self.open -= 1
        self._by_client[conn.client] -= 1
        if self._by_client[conn.client] <= 0:
            del self._by_client[conn.client]

    def _expire(self) -> None:
        now = time.monotonic()
        while (oldest := next(iter(self._waiting), None)) and oldest.since + self.limits.header_timeout_s <= now:
            self._close(oldest)
            self.closed["header_timeout"] += 1

    def _read(self, conn: Connection) -> None:
        try:
            chunk = conn.sock.recv(HEAD_LIMIT)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._close(conn)
            return
        conn.head += chunk
        if b"\r\n\r\n" in conn.head:
            self._complete(conn)
        elif len(conn.head) >= HEAD_LIMIT:
            self._reply(conn, _plain(431, "Request Header Fields Too Large", "the request head is too long"), False)
            self.closed["head_too_long"] += 1

    def _complete(self, conn: Connection) -> None:
        end = conn.head.index(b"\r\n\r\n") + 4
        if end > HEAD_LIMIT:
            self._reply(conn, _plain(431, "Request Header Fields Too Large", "the request head is too long"), False)
            self.closed["head_too_long"] += 1
            return
        head = bytes(conn.head[:end])
        del conn.head[:end]
        if not self._authorized(head):
            self._reply(conn, *self._answer(conn, head))
        elif self.serving >= self.limits.max_requests:
            self.busy += 1
            self._reply(conn, _plain(503, "Service Unavailable", "busy: every request slot is in use"), False)
        else:
            self._unwait(conn)
            self.serving += 1
            threading.Thread(target=self._work, args=(conn, head), name="strata-peer-request", daemon=True).start()

    def _reply(self, conn: Connection, response: bytes, keep: bool) -> None:
        """Send a small answer without blocking; a client that cannot take a few hundred bytes is closed."""
        try:
            sent = conn.sock.send(response)
        except OSError:
            sent = -1
        if sent != len(response) or not keep:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_WR)
            self._close(conn)
            return
        self._unwait(conn)
        self._wait(conn)  # the next head has its own deadline

    def _work(self, conn: Connection, head: bytes) -> None:
        keep = False
        try:
            conn.sock.setblocking(True)
            keep = self._serve(conn, head)
        finally:
            self._post(conn, keep)

    def _returned(self, conn: Connection, keep: bool) -> None:
        self.serving -= 1
        if keep and not self._stopped:
            self._wait(conn)
        else:
            conn.head.clear()
            self._close(conn)

    def metrics(self) -> list[tuple[str, str, float]]:
        """(name, labels, value) of what the doorman counts, for `/metrics`; read on its own thread."""
        rows: list[tuple[str, str, float]] = [
            ("strata_peer_connections_open", "", self.open),
            ("strata_peer_connections_waiting", "", len(self._waiting)),
            ("strata_peer_requests_in_flight", "", self.serving),
            ("strata_peer_requests_busy_total", "", self.busy),
        ]
        for reason in ("header_timeout", "client_share", "full", "head_too_long"):
            rows.append(("strata_peer_connections_closed_total", f'reason="{reason}"', self.closed[reason]))
        for name in ("max_connections", "max_connections_per_client", "max_requests", "max_transfers"):
            rows.append(("strata_peer_limit", f'limit="{name}"', getattr(self.limits, name)))
        rows.append(("strata_peer_limit", 'limit="header_timeout_seconds"', self.limits.header_timeout_s))
        return rows


def _plain(status: int, reason: str, text: str) -> bytes:
    body = (text + "\n").encode()
    return (
        f"HTTP/1.1 {status} {reason}\r\nRetry-After: 1\r\nContent-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode() + body
