"""Socket settings both ends of a node-local connection share.

Stdlib only: the engine-side client (`strata_kv.client`) uses it too.
"""

from __future__ import annotations

import contextlib
import socket

UNIX_SEND_BUFFER = 4 * 1024 * 1024
"""SO_SNDBUF asked for on a Unix socket (the kernel caps it at net.core.wmem_max).

On a Unix stream socket the sender's buffer is all that may be in flight: at Linux's default (208 KiB) a 1 MiB
chunk went out in 7 writes and 4 waits of the server's loop (TCP: 3 and 1, its buffers grow by themselves), and
every wait is a hand-over between processes that a loaded node schedules late. With the buffer a chunk's size, a
chunk goes in one write either way."""


def widen_unix_send_buffer(sock: socket.socket | None) -> None:
    """Ask for `UNIX_SEND_BUFFER` on `sock`; where the system refuses, the default stays (slower, still correct)."""
    if sock is None:
        return
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, UNIX_SEND_BUFFER)
