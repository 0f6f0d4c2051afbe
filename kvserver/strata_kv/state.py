"""Server and per-connection state that commands read and update."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from .store import TieredStore

Parts = bytes | list[bytes]
"""An encoded reply: one buffer, or parts written one after another (large values stay uncopied)."""


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


@dataclass
class ServerState:
    """Everything commands may touch besides the session: the store, limits, auth, counters."""

    store: TieredStore
    token: bytes | None
    started: float = field(default_factory=time.time)
    sessions: dict[int, Session] = field(default_factory=dict)
    total_connections: int = 0
    rejected_connections: int = 0
    commands_processed: int = 0
    tcp_port: int = 0
    unix_socket: str = ""
