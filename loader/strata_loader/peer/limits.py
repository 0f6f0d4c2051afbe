"""What one `serve-peer` spends on connections, and how it stays within that when clients are slow or hostile.

Anyone who reaches the peer port can open connections; only fetchers with the token may start a transfer. So:
- a connection gets a thread only while fewer than `max_connections` are open, and fewer than
  `max_connections_per_client` from its address (one pod cannot take them all);
- every other connection goes to one overflow thread, which reads its request head for a short while and
  answers it (`/healthz` with the peer's state, anything else 503 Retry-After) and closes it: no thread per
  connection, and a readiness probe is answered however many connections are open;
- a request head (request line and headers) must arrive whole within `header_timeout_s` of the connection
  opening or the previous answer ending (one deadline for the whole head, not one per read: a byte every few
  seconds does not keep a connection);
- a transfer slot (`max_transfers`) is taken by an authenticated file request only, for that request, after
  its token is checked: idle or unauthenticated connections hold none.
"""

from __future__ import annotations

import collections
import contextlib
import io
import selectors
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..contract import PEER_HEALTH_PATH

DEFAULT_MAX_CONNECTIONS = 128
DEFAULT_MAX_CONNECTIONS_PER_CLIENT = 16
DEFAULT_MAX_TRANSFERS = 64
DEFAULT_HEADER_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class PeerLimits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    """Connections served at once, one thread each (a fetcher keeps at most 5 open to one peer)."""
    max_connections_per_client: int = DEFAULT_MAX_CONNECTIONS_PER_CLIENT
    """Of those, from one client address."""
    max_transfers: int = DEFAULT_MAX_TRANSFERS
    """File ranges sent at once; one more is answered 503 Retry-After and the fetcher tries another peer."""
    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    """The whole request head must arrive within this (it also closes a kept-alive connection left idle)."""
    send_timeout_s: float = 30.0
    """An answer whose reader stops reading this long is abandoned (and its transfer slot freed)."""
    overflow_timeout_s: float = 2.0
    """How long the overflow thread waits for a request head before it closes the connection unanswered."""
    max_overflow: int = 1024
    """Connections the overflow thread holds at once; past it, new ones are closed at once."""

    def check(self) -> None:
        for name in ("max_connections", "max_connections_per_client", "max_transfers"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} {getattr(self, name)}: must be at least 1")
        if not self.header_timeout_s > 0:
            raise ValueError(f"--header-timeout {self.header_timeout_s}: must be more than 0 seconds")


class ConnectionGate:
    """Counts open connections, in all and per client address."""

    def __init__(self, limits: PeerLimits) -> None:
        self.limits = limits
        self._lock = threading.Lock()
        self._open = 0
        self._by_client: collections.Counter[str] = collections.Counter()

    def admit(self, client: str) -> bool:
        with self._lock:
            if self._open >= self.limits.max_connections:
                return False
            if self._by_client[client] >= self.limits.max_connections_per_client:
                return False
            self._open += 1
            self._by_client[client] += 1
            return True

    def leave(self, client: str) -> None:
        with self._lock:
            self._open -= 1
            self._by_client[client] -= 1
            if self._by_client[client] <= 0:
                del self._by_client[client]


class DeadlineReader(io.RawIOBase):
    """A socket's reads, each allowed only what is left until `deadline()`: one deadline for a whole request
    head however the client spaces its bytes (a per-read timeout is reset by every byte)."""

    def __init__(self, sock: socket.socket, deadline: Callable[[], float]) -> None:
        self._sock, self._deadline = sock, deadline

    def readable(self) -> bool:
        return True

    def readinto(self, b: bytearray | memoryview) -> int:  # type: ignore[override]
        left = self._deadline() - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request head did not arrive within the header timeout")
        self._sock.settimeout(left)
        return self._sock.recv_into(b)


HEAD_LIMIT = 8192


class Overflow:
    """One thread for every connection over the limits: it reads the request head (at most `HEAD_LIMIT` bytes,
    within `overflow_timeout_s`), answers, and closes. Reading first matters: closing on unread bytes resets the
    connection, and a fetcher would take a busy peer for a dead one."""

    def __init__(self, limits: PeerLimits, health: Callable[[], tuple[int, str]]) -> None:
        self.limits, self._health = limits, health
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._lock = threading.Lock()
        self._new: collections.deque[socket.socket] = collections.deque()
        self._open: dict[socket.socket, tuple[float, bytearray]] = {}
        self._stopped = False
        self._thread = threading.Thread(target=self._run, name="strata-peer-overflow", daemon=True)
        self._thread.start()

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            self._new.append(sock)
        self._wake()

    def close(self) -> None:
        self._stopped = True
        self._wake()
        self._thread.join(timeout=5)

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # a full wake-up pipe: the thread is awake already
            self._wake_w.send(b"\0")

    def _run(self) -> None:
        while not self._stopped:
            now = time.monotonic()
            soonest = min((d for d, _ in self._open.values()), default=now + 1.0)
            for key, _ in self._selector.select(max(0.0, soonest - now)):
                if key.fileobj is self._wake_r:
                    self._adopt()
                else:
                    self._read(key.fileobj)  # type: ignore[arg-type]
            now = time.monotonic()
            for sock in [s for s, (d, _) in self._open.items() if d <= now]:
                self._drop(sock)
        for sock in list(self._open):
            self._drop(sock)
        for sock in self._new:
            sock.close()
        self._selector.close()
        self._wake_r.close()
        self._wake_w.close()

    def _adopt(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except OSError:
            pass
        with self._lock:
            new, self._new = list(self._new), collections.deque()
        for sock in new:
            if len(self._open) >= self.limits.max_overflow:
                sock.close()
                continue
            sock.setblocking(False)
            self._selector.register(sock, selectors.EVENT_READ)
            self._open[sock] = (time.monotonic() + self.limits.overflow_timeout_s, bytearray())

    def _read(self, sock: socket.socket) -> None:
        try:
            chunk = sock.recv(4096)
        except BlockingIOError:
            return
        except OSError:
            self._drop(sock)
            return
        head = self._open[sock][1]
        head += chunk
        if chunk and b"\r\n\r\n" not in head and len(head) < HEAD_LIMIT:
            return
        if chunk:
            self._answer(sock, bytes(head))
        self._drop(sock)

    def _answer(self, sock: socket.socket, head: bytes) -> None:
        words = head.split(b"\r\n", 1)[0].split()
        health = len(words) >= 2 and words[0] in (b"GET", b"HEAD")
        if health and urlsplit(words[1].decode("latin-1")).path == PEER_HEALTH_PATH:
            status, text = self._health()
            reason = "OK" if status == 200 else "Service Unavailable"
        else:
            status, reason, text = 503, "Service Unavailable", "busy: every connection is in use"
        body = (text + "\n").encode()
        response = (
            f"HTTP/1.1 {status} {reason}\r\nRetry-After: 1\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
        ).encode() + (b"" if words[:1] == [b"HEAD"] else body)
        try:
            sock.send(response)  # small: it fits the socket's buffer
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass

    def _drop(self, sock: socket.socket) -> None:
        if self._open.pop(sock, None) is not None:
            self._selector.unregister(sock)
        sock.close()
