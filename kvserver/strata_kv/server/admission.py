"""Who gets a connection slot, and for how long: `limits.max_clients`, the unauthenticated share, the AUTH
deadline and the idle timeout; and the token AUTH checks against.

Kept apart from the connection because the rules are server-wide (one table of connections, one sweep over
them, as Redis' clientsCron) and because they are what stands between the port and a flood of silent sockets.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Protocol

from ..config import LimitsConfig
from .state import AUTH_TIMEOUT, IDLE_TIMEOUT, UNAUTHENTICATED_EVICTED, ServerState

log = logging.getLogger(__name__)

MIN_TOKEN_BYTES = 16  # shorter auth tokens get a warning at start


class Client(Protocol):
    """What the table needs of a connection (the server's `RespConnection`)."""

    transport: asyncio.Transport | None

    def expired(self, now: float) -> str | None: ...

    def drop(self, reason: str) -> None: ...


class ClientTable:
    """Every open connection, and the unauthenticated ones oldest first (by session id)."""

    def __init__(self, limits: LimitsConfig, state: ServerState) -> None:
        self.limits = limits
        self.state = state
        self.connections: set[Client] = set()
        self.unauthenticated: dict[int, Client] = {}  # by session id, oldest first

    def admit(self, pre_auth: bool) -> bool:
        """Whether a new connection gets a slot; to make room, the oldest unauthenticated one may go.

        Every connection starts unauthenticated, so refusing newcomers once unauthenticated
        connections fill their share (or all of `max_clients`) would let a few silent sockets lock
        every real client out. Closing the oldest of them instead means a client that authenticates
        promptly gets in unless sockets are opened faster than it can send AUTH.
        """
        full = len(self.state.sessions) >= self.limits.max_clients
        crowded = pre_auth and len(self.unauthenticated) >= self.limits.max_unauthenticated_clients
        if not (full or crowded):
            return True
        if not self.unauthenticated:
            return False
        next(iter(self.unauthenticated.values())).drop(UNAUTHENTICATED_EVICTED)
        return True

    def forget(self, conn: Client, session_id: int | None) -> None:
        """Give the connection's slot back: it no longer counts against `max_clients`."""
        self.connections.discard(conn)
        if session_id is not None:
            self.state.sessions.pop(session_id, None)
            self.unauthenticated.pop(session_id, None)

    def sweep_interval(self) -> float | None:
        """How often `reap` looks (a quarter of the shortest deadline, within 0.05-1 s), or None: no deadlines."""
        timeouts = [self.limits.idle_timeout_seconds]
        if self.state.token is not None:
            timeouts.append(self.limits.auth_timeout_seconds)
        timeouts = [t for t in timeouts if t > 0]
        return max(0.05, min(1.0, min(timeouts) / 4)) if timeouts else None

    async def reap(self, interval: float) -> None:
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


def deadline_passed(
    limits: LimitsConfig, pre_auth: bool, connected_at: float, last_active: float, running: bool, now: float
) -> str | None:
    """Why a connection should be closed now (AUTH deadline or idle timeout), or None.

    Idle means: no complete request received, no command finished and no reply progress for
    `idle_timeout_seconds`, and no command running. A client that trickles bytes without
    completing requests, or stops reading its replies, goes idle; one waiting on a long
    command does not.
    """
    if pre_auth and limits.auth_timeout_seconds and now - connected_at > limits.auth_timeout_seconds:
        return AUTH_TIMEOUT
    if limits.idle_timeout_seconds and not running and now - last_active > limits.idle_timeout_seconds:
        return IDLE_TIMEOUT
    return None


def read_token(path: str | None) -> bytes | None:
    """The AUTH token from `auth.token_file`, or None: no AUTH. A missing or empty file ends the start."""
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
