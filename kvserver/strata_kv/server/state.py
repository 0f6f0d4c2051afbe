"""Server and per-connection state that commands read and update."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from ..store.tiered import TieredStore
from ..wire.shared_memory import SharedReply

Parts = bytes | list[bytes] | SharedReply
"""An encoded reply: one buffer, parts written one after another (large values stay uncopied), or a value's
memory handed over with its header (`shared_memory`)."""

UNIX_ADDR = "unix"
"""`Session.addr` of a connection on the Unix socket (the only one that may be handed memory)."""

# Why the server closed a connection (the `reason` label of strata_kv_client_disconnections_total).
OUTPUT_BUFFER_LIMIT = "output_buffer_limit"
"""A reply would take the client's pending output past `limits.max_output_buffer`."""
AUTH_TIMEOUT = "auth_timeout"
"""Not authenticated within `limits.auth_timeout_seconds` of connecting."""
IDLE_TIMEOUT = "idle_timeout"
"""Idle for `limits.idle_timeout_seconds`."""
UNAUTHENTICATED_EVICTED = "unauthenticated_evicted"
"""The oldest unauthenticated connection, closed to make room for a new one."""
AUTH_FAILURES = "auth_failures"
"""`auth.max_failures` failed AUTH attempts on the connection."""


class OutputLimitExceeded(Exception):
    """Raised by a command whose reply grows past `limits.max_output_buffer`: stop building it.

    The connection closes, as for any reply over the limit; raising early saves reading the rest
    of an MGET's values (from L2, perhaps) for a reply that will not be sent.
    """


@dataclass
class Session:
    """Per-connection state."""

    id: int
    addr: str
    authenticated: bool
    name: bytes = b""
    created: float = field(default_factory=time.time)
    last_set_key: bytes | None = None
    last_set_time: float = 0.0
    close_after_reply: bool = False
    proto: int = 2
    commands: int = 0
    auth_failures: int = 0


@dataclass
class ServerState:
    """Everything commands may touch besides the session: the store, limits, auth, counters."""

    store: TieredStore
    token: bytes | None
    started: float = field(default_factory=time.time)
    sessions: dict[int, Session] = field(default_factory=dict)
    total_connections: int = 0
    rejected_connections: int = 0
    disconnections: Counter[str] = field(default_factory=Counter)
    """Connections the server closed, by reason (`strata_kv_client_disconnections_total{reason}`)."""
    commands_processed: int = 0
    values_refused: int = 0
    """Large values read and dropped because no memory could be mapped for them (the command got `-OOM`)."""
    shared_replies: int = 0
    """STRATA.GETFD replies that handed over a memfd (the rest were sent as bytes)."""
    sender_replies: int = 0
    """Replies sent by the sender threads (`listen.sender_threads`): those holding a value above 1 MiB."""
    tcp_port: int = 0
    unix_socket: str = ""
    inflight: Any = None
    """The server's `InflightBudget` (large values received, not yet stored); None outside a server."""
    value_pool: Any = None
    """The server's `ValuePool` (buffers of dropped large values, kept for reuse)."""
    exports: Any = None
    """The server's `ExportLedger` (values handed over as memory that clients may still hold), with
    `listen.shared_memory`; None otherwise."""
