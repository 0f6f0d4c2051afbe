"""What the server has handed out as memory (`STRATA.GETFD`) and clients may still hold, within a budget per client
and per server (`listen.shared_memory_client_budget`, `listen.shared_memory_budget`).

A value's memfd pages outlive L1's copy as long as any client holds the descriptor or a mapping, and they stay
charged to the server's cgroup: a client that keeps every memfd it is handed would grow the node's shared memory
without bound while L1 evicts. So each handed-over value is counted from its first hand-over until no client
holds it any more, which the server sees for itself: every hand-over carries a shared lock on an open file of
its own (`ExportHandle`), and the value stops counting once an exclusive lock can be taken (`still_handed_out`),
looked at every `SWEEP_SECONDS` and whenever a budget would be passed. A value counts against each connection
it went to until that connection closes, and against the server until the last holder lets go (a client that
reconnects leaves what it hoarded on the server's count). Past either budget a GETFD is answered with the
value's bytes (the ordinary inline reply), so a hoarding client slows itself, not the node.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
from dataclasses import dataclass, field

from ..wire.shared_memory import ExportHandle, ValueMapping, export, probe_handle, still_handed_out

log = logging.getLogger(__name__)

SWEEP_SECONDS = 1.0
"""How often values no client holds any more stop counting (and their pages, if L1 dropped them, are freed)."""


@dataclass(eq=False)
class _Exported:
    size: int
    probe: int  # an open file of the memfd: the server's handle for `still_handed_out`
    sessions: set[int] = field(default_factory=set)


class ExportLedger:
    """Handed-over values by memfd inode, oldest first, and the bytes each connection and the server account for."""

    def __init__(self, client_budget: int, server_budget: int) -> None:
        self.client_budget, self.server_budget = client_budget, server_budget
        self._values: dict[int, _Exported] = {}
        self._by_session: collections.defaultdict[int, set[int]] = collections.defaultdict(set)
        self.client_bytes: collections.Counter[int] = collections.Counter()
        self.bytes = 0
        self.over_budget: collections.Counter[str] = collections.Counter()
        """GETFDs answered inline because a budget was full, by `client` or `server`."""

    def hand_over(self, session: int, mapping: ValueMapping) -> ExportHandle | None:
        """A handle to send `mapping`'s value to `session`, counted; None when a budget is full (answer inline)."""
        inode, size = os.fstat(mapping.fd).st_ino, len(mapping)
        full = self._full(session, inode, size)
        if full is not None:
            self.sweep()
            full = self._full(session, inode, size)
        if full is not None:
            self.over_budget[full] += 1
            return None
        known = self._values.get(inode)
        try:
            handle = ExportHandle(export(mapping))
            if known is None:
                known = _Exported(size, probe_handle(mapping.fd))
        except OSError as e:  # out of descriptors: the bytes go inline, as for a value without a memfd
            log.warning("cannot hand a value over as memory (%s): answering with its bytes", e)
            return None
        if inode not in self._values:
            self._values[inode] = known
            self.bytes += size
        if session not in known.sessions:
            known.sessions.add(session)
            self._by_session[session].add(inode)
            self.client_bytes[session] += size
        return handle

    def _full(self, session: int, inode: int, size: int) -> str | None:
        """Which budget handing this value to `session` would pass: "client", "server", or None."""
        known = self._values.get(inode)
        if (known is None or session not in known.sessions) and self.client_bytes[session] + size > self.client_budget:
            return "client"
        if known is None and self.bytes + size > self.server_budget:
            return "server"
        return None

    def forget(self, session: int) -> None:
        """A connection closed: what it was handed stops counting against it (not against the server)."""
        for inode in self._by_session.pop(session, ()):
            if (value := self._values.get(inode)) is not None:
                value.sessions.discard(session)
        self.client_bytes.pop(session, None)

    def sweep(self) -> int:
        """Stop counting every value no client holds any more; the bytes that stopped counting."""
        freed = 0
        for inode, value in list(self._values.items()):
            if still_handed_out(value.probe):
                continue
            os.close(value.probe)
            del self._values[inode]
            self.bytes -= value.size
            freed += value.size
            for session in value.sessions:
                self.client_bytes[session] -= value.size
                self._by_session[session].discard(inode)
        return freed

    @property
    def values(self) -> int:
        return len(self._values)

    async def sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(SWEEP_SECONDS)
            self.sweep()

    def close(self) -> None:
        for value in self._values.values():
            with contextlib.suppress(OSError):
                os.close(value.probe)
        self._values.clear()
