"""The tiered store: L1 DRAM in front of L2 (filesystem and/or S3), write-behind, promotion on hit."""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from .config import KVServerConfig
from .fstier import FsTier
from .kvevents import EventPublisher
from .l2 import L2Tier
from .memory import MemoryTier
from .offload_stats import OffloadStats
from .policy import make_policy
from .s3tier import S3Tier
from .writebehind import Sink, WriteBehind

log = logging.getLogger(__name__)


class StoreFull(Exception):
    """L1 cannot take the value and there is no L2 to put it in."""


class TieredStore:
    def __init__(self, cfg: KVServerConfig) -> None:
        self.cfg = cfg
        l1 = cfg.l1
        self.l1 = MemoryTier(
            l1.size,
            make_policy(l1.eviction_policy, l1.size, l1.hir_fraction),
            grace_seconds=l1.exists_grace_seconds,
        )
        self.l2: list[L2Tier] = []  # nearest first
        if cfg.l2.fs:
            self.l2.append(FsTier(cfg.l2.fs, cfg.namespace, int(cfg.limits.max_value_size)))
        if cfg.l2.s3:
            self.l2.append(S3Tier(cfg.l2.s3, cfg.namespace, cfg.l2.fs.rank if cfg.l2.fs else 0))
        sinks: list[tuple[str, Sink]] = [(tier.name, tier.put) for tier in self.l2]
        wb = cfg.write_behind
        self.write_behind = WriteBehind(sinks, wb.queue_items, wb.queue_bytes, wb.workers) if sinks else None
        self.counters: Counter[str] = Counter()
        self.offload = OffloadStats(l1.size)
        """Bytes, seconds and unread chunks for the operator's offload verdict (`offload_stats.py`)."""
        self.events: EventPublisher | None = EventPublisher(cfg.events) if cfg.events.publish else None
        """KV events for vLLM-tier blocks (stored, gone from every tier); None unless `events.publish`."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self.ready = False
        self._rescan_tasks: list[asyncio.Task[None]] = []

    @property
    def has_l2(self) -> bool:
        return self.write_behind is not None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self.events is not None:
            self.events.start()
            for tier in self.l2:
                tier.on_evict = self._l2_evicted_threadsafe
            if not self.l2:
                self.events.cleared()  # a restarted server without L2 holds nothing a router may remember
        for tier in self.l2:
            await asyncio.to_thread(tier.prepare)
        if self.write_behind:
            self.write_behind.start()
        for tier in self.l2:
            if tier.rescan_interval > 0:
                self._rescan_tasks.append(asyncio.create_task(self._rescan_loop(tier)))
        self.ready = True

    async def _rescan_loop(self, tier: L2Tier) -> None:
        """Other nodes write into a shared L2 too: recount it now and then, then enforce capacity."""
        while True:
            await asyncio.sleep(tier.rescan_interval)
            try:
                await asyncio.to_thread(tier.rescan)
            except tier.read_failure as e:
                log.warning("L2 %s rescan failed: %s", tier.name, e)

    async def close(self) -> bool:
        """Drain the write-behind queue (bounded by the configured timeout); True if fully drained."""
        self.ready = False
        for task in self._rescan_tasks:
            task.cancel()
        drained = True
        if self.write_behind:
            drained = await self.write_behind.close(self.cfg.write_behind.drain_timeout_seconds)
            if not drained:
                log.warning("shutdown: %d chunks were not written to L2 in time", self.write_behind.depth)
        if self.events is not None:
            await asyncio.to_thread(self.events.close)
        return drained

    # -- KV events --------------------------------------------------------------------------------
    def held(self, key: bytes) -> bool:
        """Does any tier still hold `key` (L1, the write-behind queue, an L2 index)? No I/O."""
        if key in self.l1 or (self.write_behind is not None and key in self.write_behind.pending):
            return True
        return any(tier.holds(key) for tier in self.l2)

    def _dropped_from_l1(self, keys: list[bytes]) -> None:
        """L1 evicted `keys`: a key no other tier holds is gone (one in L2 merely moved)."""
        if self.events is not None:
            for key in keys:
                if not self.held(key):
                    self.events.removed(key)

    def _l2_evicted_threadsafe(self, key: bytes) -> None:
        """An L2 tier evicted `key` (called from its thread): decide on the loop, where L1 lives."""
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._dropped_from_l1, [key])

    # -- reads ------------------------------------------------------------------------------------
    async def get(self, key: bytes) -> bytes | None:
        started = time.perf_counter()
        value = self.l1.get(key)
        if value is None and self.write_behind:
            value = self.write_behind.pending.get(key)
        if value is not None:
            self.counters["hits_l1"] += 1
            self.offload.hit(key, "l1", len(value), time.perf_counter() - started)
            return value
        tier, value = await self._get_l2(key)
        if value is None:
            self.counters["misses"] += 1
            self.offload.missed(time.perf_counter() - started, self.l1.policy.ghost_distance(key))
            return None
        self.counters[f"hits_{tier}"] += 1
        self._promote(key, value)
        self.offload.hit(key, tier, len(value), time.perf_counter() - started)
        return value

    async def _get_l2(self, key: bytes) -> tuple[str, bytes | None]:
        """The first L2 tier that has `key`, nearest first; a failing tier counts an error and is a miss."""
        for tier in self.l2:
            try:
                value = await asyncio.to_thread(tier.get, key)
            except tier.read_failure as e:
                self.counters[f"errors_{tier.name}"] += 1
                log.warning("L2 %s read failed: %s", tier.name, e)
                continue
            if value is not None:
                return tier.name, value
        return "", None

    def _promote(self, key: bytes, value: bytes) -> None:
        try:
            self._dropped_from_l1(self.l1.put(key, value))
            self.counters["promotions"] += 1
        except MemoryError:
            pass  # too large or L1 pinned full: serve it without caching

    async def exists(self, key: bytes) -> bool:
        """Present in any tier. An L1 hit is pinned for the grace period (LMCache GETs right after)."""
        if key in self.l1:
            self.l1.pin(key)
            return True
        if self.write_behind and key in self.write_behind.pending:
            return True
        return (await self.locate(key)) != ""

    async def locate(self, key: bytes) -> str:
        """Which tier holds `key`: 'l1', 'fs', 's3' or '' for none."""
        if key in self.l1 or (self.write_behind and key in self.write_behind.pending):
            return "l1"
        grace = self.cfg.l1.exists_grace_seconds
        for tier in self.l2:
            try:
                if await asyncio.to_thread(tier.contains, key, grace):
                    return tier.name
            except tier.read_failure as e:
                self.counters[f"errors_{tier.name}"] += 1
                log.warning("L2 %s lookup failed: %s", tier.name, e)
        return ""

    async def prefix(self, keys: list[bytes]) -> list[str]:
        """Tiers of the leading resident chunks of a chain; stops at the first miss.

        Teaches L1 the chain (parent -> child links), and pins the L1 part for the grace period.
        """
        tiers: list[str] = []
        prev: bytes | None = None
        for key in keys:
            tier = await self.locate(key)
            if not tier:
                break
            if tier == "l1":
                self.l1.pin(key)
                if prev is not None:
                    self.l1.link(prev, key)
            tiers.append(tier)
            prev = key
        return tiers

    # -- writes -----------------------------------------------------------------------------------
    def get_nowait(self, key: bytes) -> bytes | None:
        """An L1 (or write-behind) hit without leaving the event loop; None means: use `get`."""
        started = time.perf_counter()
        value = self.l1.get(key)
        if value is None and self.write_behind is not None:
            value = self.write_behind.pending.get(key)
        if value is not None:
            self.counters["hits_l1"] += 1
            self.offload.hit(key, "l1", len(value), time.perf_counter() - started)
        return value

    def _set_l1(self, key: bytes, value: bytes, parent: bytes | None) -> None:
        started = time.perf_counter()
        self._put_l1(key, value, parent)
        self.offload.stored(key, len(value), time.perf_counter() - started)
        self.offload.sweep(self.l1.__contains__, len(self.l1))

    def _put_l1(self, key: bytes, value: bytes, parent: bytes | None) -> None:
        self.counters["sets"] += 1
        self.counters["bytes_in"] += len(value)
        try:
            evicted = self.l1.put(key, value, parent, force=not self.has_l2)  # no L2: nowhere else to keep it
        except MemoryError as e:
            if not self.write_behind:
                raise StoreFull(str(e)) from e
            self.l1.delete(key)  # an older value must not shadow the new one
            evicted = []
        if self.events is not None:
            self.events.stored(key)  # in L1, or about to be queued for L2
            self._dropped_from_l1(evicted)

    def set_nowait(self, key: bytes, value: bytes, parent: bytes | None = None) -> bool:
        """SET without waiting; False (nothing done) when the write-behind queue is full."""
        if self.write_behind is not None and self.write_behind.full(len(value)):
            return False
        self._set_l1(key, value, parent)
        if self.write_behind is not None:
            queued = self.write_behind.try_submit(key, value)
            assert queued, "write-behind refused after reporting room"
        return True

    async def set(self, key: bytes, value: bytes, parent: bytes | None = None) -> None:
        self._set_l1(key, value, parent)
        if self.write_behind:
            await self.write_behind.submit(key, value)

    async def delete(self, key: bytes) -> bool:
        found = self.l1.delete(key)
        if self.write_behind:
            if key in self.write_behind.pending:
                self.write_behind.discard(key)
                found = True
            await self.write_behind.wait_written(key)
        for tier in self.l2:
            try:
                found = await asyncio.to_thread(tier.delete, key) or found
            except tier.read_failure as e:
                log.warning("L2 %s delete failed: %s", tier.name, e)
        if found and self.events is not None:
            self.events.removed(key)
        return found

    def link(self, parent: bytes, child: bytes) -> None:
        self.l1.link(parent, child)

    # -- introspection ----------------------------------------------------------------------------
    def failing_l2_tiers(self) -> list[str]:
        """L2 tiers whose latest write failed (disk full, bucket gone...): L1 still serves, L2 does not grow."""
        if not self.write_behind:
            return []
        return [tier for tier, failing in self.write_behind.failing.items() if failing]

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "l1_used_bytes": self.l1.used,
            "l1_capacity_bytes": self.l1.capacity,
            "l1_keys": len(self.l1),
            "l1_evictions": self.l1.evictions,
            "l1_rejections": self.l1.rejections,
            "l1_policy": self.cfg.l1.eviction_policy.value,
        }
        for name in ("hits_l1", "hits_fs", "hits_s3", "misses", "sets", "bytes_in", "promotions"):
            out[name] = self.counters[name]
        if self.write_behind:
            out["write_behind_depth"] = self.write_behind.depth
            out["write_behind_bytes"] = self.write_behind.queued_bytes
            out["write_behind_written"] = self.write_behind.written
            out["write_behind_backpressure_waits"] = self.write_behind.backpressure_waits
            for name, n in self.write_behind.errors.items():
                out[f"{name}_write_errors"] = n
                out[f"{name}_write_failing"] = int(self.write_behind.failing[name])
            out["l2_failing"] = int(any(self.write_behind.failing.values()))
            out["write_behind_last_error"] = self.write_behind.last_error
        if self.events is not None:
            out.update(self.events.stats())
        for tier in self.l2:  # write errors come from the write-behind counters above
            out.update({f"{tier.name}_{k}": v for k, v in tier.stats().items() if k != "write_errors"})
        return out
