"""The asyncio RESP server: TCP and Unix socket listeners, one `RespConnection` per client, and the store, budget
and metrics they share.

Each connection parses as bytes arrive and runs commands in order in its own task. Backpressure is
two-sided: reading pauses when `max_pipeline_depth` commands wait for replies, and writing a reply
(and with it command processing) pauses, part by part (large parts slice by slice), while the transport's
write buffer is full. The connection's concerns have modules of their own: `connection` (the protocol and the
command loop), `admission` (slots, deadlines, the token), `intake` (reading and large values), `output` (writing
replies), `senders` (sender threads) and `cpus` (the CPUs the server may use).
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import stat
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ..config import KVServerConfig
from ..store.tiered import TieredStore
from ..wire.valuepool import ValuePool
from .admission import ClientTable, read_token
from .connection import RespConnection, ServerParts
from .exports import ExportLedger
from .inflight import InflightBudget
from .metrics import Metrics
from .senders import SenderPool
from .state import ServerState

log = logging.getLogger(__name__)


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
        self.state = ServerState(store=self.store, token=read_token(cfg.auth.token_file))
        self.metrics = Metrics(self.state)
        self.inflight = InflightBudget(cfg.inflight_budget)
        # Recycled buffers: at most another in-flight budget; memfd-backed when values may be handed over as memory.
        self.value_pool = ValuePool(cfg.inflight_budget, shared=cfg.listen.shared_memory)
        self.store.l1.on_drop = self.value_pool.give
        self.state.value_pool = self.value_pool
        listen = cfg.listen
        if listen.shared_memory:
            self.state.exports = ExportLedger(int(listen.shared_memory_client_budget), int(listen.shared_memory_budget))
        self.state.inflight = self.inflight
        threads = cfg.listen.sender_threads
        self.senders = SenderPool(threads) if threads else None
        self._servers: list[asyncio.Server] = []
        self.clients = ClientTable(cfg.limits, self.state)
        self.parts = ServerParts(
            limits=cfg.limits,
            shared_memory=cfg.listen.shared_memory,
            state=self.state,
            value_pool=self.value_pool,
            inflight=self.inflight,
            senders=self.senders,
            clients=self.clients,
            metrics=self.metrics,
        )
        self._reaper: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=32, thread_name_prefix="strata-kv-io"))
        if self.cfg.metrics.port >= 0:
            await self.metrics.start(self.cfg.metrics.bind, self.cfg.metrics.port)
        await self.store.start()
        interval = self.clients.sweep_interval()
        if interval is not None:
            self._reaper = loop.create_task(self.clients.reap(interval))
        listen = self.cfg.listen
        if listen.shared_memory:
            _raise_open_file_limit()
            self._sweeper = loop.create_task(self.state.exports.sweep_forever())
        if listen.tcp_enabled:
            srv = await loop.create_server(
                lambda: RespConnection(self.parts), listen.bind, listen.port, reuse_address=True, backlog=1024
            )
            self._servers.append(srv)
            self.state.tcp_port = srv.sockets[0].getsockname()[1]
        if listen.unix_socket:
            path = Path(listen.unix_socket)
            if path.exists() and stat.S_ISSOCK(path.stat().st_mode):
                path.unlink()  # left over from a killed server
            srv = await loop.create_unix_server(lambda: RespConnection(self.parts), str(path), backlog=1024)
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

    async def stop(self) -> None:
        """Stop accepting, let connections finish, drain write-behind to L2, then close."""
        for task in (self._reaper, self._sweeper):
            if task is not None:
                task.cancel()
        for srv in self._servers:
            srv.close()
        for conn in list(self.clients.connections):
            if conn.transport is not None:
                conn.transport.close()
        drained = await self.store.close()
        await self.metrics.stop()
        if self.senders is not None:
            self.senders.shutdown()
        if self.state.unix_socket:
            Path(self.state.unix_socket).unlink(missing_ok=True)
        if self.state.exports is not None:
            self.state.exports.close()
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
