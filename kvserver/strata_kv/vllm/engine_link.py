"""An inference engine's link to its node's KV server: a connection pool, timeouts and a circuit breaker.

Used by the vLLM tier (`strata_kv.vllm.tier`) inside the engine's scheduler process, so it imports the standard
library only: a serving image gets it with `pip install strata` (no extras: no numpy, boto3 or uvloop). Every
call is bounded by a socket timeout, and after `failure_threshold` failures in a row the breaker opens: calls
fail at once, without I/O, until `reset_after_s` has passed and one probe call gets through. So a dead server
costs one timeout per breaker period, never a request's progress.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlsplit

from ..client import KVClient, KVError

T = TypeVar("T")

DEFAULT_PORT = 6379


class ServerUnavailable(ConnectionError):
    """The breaker is open: the server failed recently, so this call was not even tried."""


@dataclass(frozen=True)
class Endpoint:
    """Where the server listens: a Unix socket (a mounted node directory) wins over TCP (the node-local Service)."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    unix_socket: str | None = None

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """`redis://host:port`, `tcp://host:port` or `unix:///path/to/socket`."""
        parts = urlsplit(url)
        if parts.scheme == "unix":
            if not parts.path:
                raise ValueError(f"KV server url {url!r} names no socket path: use unix:///path/to/kv.sock")
            return cls(unix_socket=parts.path)
        if parts.scheme not in ("redis", "tcp") or not parts.hostname:
            raise ValueError(f"KV server url {url!r}: use redis://host:port, tcp://host:port or unix:///path")
        return cls(host=parts.hostname, port=parts.port or DEFAULT_PORT)

    def __str__(self) -> str:
        return f"unix://{self.unix_socket}" if self.unix_socket else f"{self.host}:{self.port}"


class CircuitBreaker:
    """Closed → open after `failure_threshold` failures in a row → one probe after `reset_after_s`."""

    def __init__(self, failure_threshold: int = 3, reset_after_s: float = 5.0) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be at least 1, got {failure_threshold}")
        if reset_after_s < 0:
            raise ValueError(f"reset_after_s must be 0 or more, got {reset_after_s}")
        self.failure_threshold = failure_threshold
        self.reset_after_s = reset_after_s
        self._failures = 0
        self._opened_at: float | None = None
        self._probing = False
        self._lock = threading.Lock()
        self.opens = 0

    @property
    def is_open(self) -> bool:
        return self._opened_at is not None

    def allow(self) -> bool:
        """Whether a call may go out now; while open, only one probe per `reset_after_s`."""
        with self._lock:
            if self._opened_at is None:
                return True
            if not self._probing and time.monotonic() - self._opened_at >= self.reset_after_s:
                self._probing = True
                return True
            return False

    def would_allow(self) -> bool:
        """`allow()` without taking the probe: for work that is dropped, not tried, while the server is down."""
        with self._lock:
            return self._opened_at is None or (
                not self._probing and time.monotonic() - self._opened_at >= self.reset_after_s
            )

    def success(self) -> None:
        with self._lock:
            self._failures = 0
            self._opened_at = None
            self._probing = False

    def failure(self) -> None:
        with self._lock:
            self._failures += 1
            if self._probing or (self._opened_at is None and self._failures >= self.failure_threshold):
                if self._opened_at is None:
                    self.opens += 1
                self._opened_at = time.monotonic()
            self._probing = False


class EngineLink:
    """Pooled connections to one server, each call under a timeout and the breaker.

    `call(fn)` runs `fn(client)` on an idle connection (or a new one); a connection that failed is closed, never
    reused, so a reply left half-read cannot be taken for the next call's; one the server closed while it sat idle
    is replaced, and the call runs again. Thread-safe: the tier's I/O threads and
    its lookup thread share one link.
    """

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        token: str | None = None,
        timeout_s: float = 5.0,
        connect_timeout_s: float = 1.0,
        max_idle: int = 8,
        breaker: CircuitBreaker | None = None,
    ) -> None:
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError(f"timeouts must be positive, got timeout_s={timeout_s}, connect={connect_timeout_s}")
        self.endpoint = endpoint
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self.breaker = breaker or CircuitBreaker()
        self._token = token
        self._max_idle = max_idle
        self._idle: list[KVClient] = []
        self._lock = threading.Lock()
        self._closed = False
        self.connects = 0
        self.stale_connections = 0
        """Pooled connections found closed by the server when a call took them (each call then ran anew)."""

    def _connect(self) -> KVClient:
        client = KVClient(
            self.endpoint.host,
            self.endpoint.port,
            unix_socket=self.endpoint.unix_socket,
            timeout=self.connect_timeout_s,
        )
        try:
            client.settimeout(self.timeout_s)
            if self._token is not None:
                client.call("AUTH", self._token)
        except KVError as e:
            client.close()
            # A refused token is the server saying "not you", on every call: count it as down, not as an answer.
            raise ConnectionRefusedError(f"KV server {self.endpoint} refused AUTH: {e}") from e
        except BaseException:
            client.close()
            raise
        self.connects += 1
        return client

    def _take(self, new: bool) -> tuple[KVClient, bool]:
        """An idle connection (True: it sat in the pool), unless `new`, or a new one (False)."""
        with self._lock:
            client = self._idle.pop() if self._idle and not new else None
        return (client, True) if client is not None else (self._connect(), False)

    def _release(self, client: KVClient) -> None:
        with self._lock:
            if self._closed or len(self._idle) >= self._max_idle:
                client.close()
            else:
                self._idle.append(client)

    def _close_idle(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for client in idle:
            client.close()

    def call(self, fn: Callable[[KVClient], T]) -> T:
        """`fn(client)` under the breaker; raises ServerUnavailable when the breaker holds the call back, and
        OSError/KVError as the call failed (both count as failures, except a KVError that answers the call: the
        server is up and said no).

        A connection that sat in the pool may have been closed by the server meanwhile (its idle timeout, a
        restart, a new pod behind the Service): one that fails that way (the connection reset or ended, not a
        timeout) is not the server failing the call. The call runs again, once, on a new connection, and the
        pool's other idle connections go with it (they sat as long). Every call the tier makes is safe to run
        twice: lookups and loads read, and a store writes the same values under the same keys."""
        if not self.breaker.allow():
            raise ServerUnavailable(f"KV server {self.endpoint} failed recently; retrying after a pause")
        stale = False
        while True:
            try:
                client, pooled = self._take(new=stale)
            except (OSError, ValueError):
                self.breaker.failure()
                raise
            try:
                result = fn(client)
            except KVError:
                self._release(client)  # an error reply was read whole: the connection is still in step
                self.breaker.success()
                raise
            except ConnectionError:
                client.close()
                if pooled:  # found closed: the others sat idle beside it, so they go too
                    stale = True
                    with self._lock:
                        self.stale_connections += 1
                    self._close_idle()
                    continue
                self.breaker.failure()
                raise
            except (OSError, ValueError):
                client.close()
                self.breaker.failure()
                raise
            except BaseException:
                client.close()
                raise
            self._release(client)
            self.breaker.success()
            return result

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self._close_idle()


def token_from_env(name: str | None) -> str | None:
    """The AUTH token from the environment variable `name` (a Secret taken with `valueFrom.secretKeyRef`)."""
    if not name:
        return None
    value = os.environ.get(name)
    return value.strip() if value else None
