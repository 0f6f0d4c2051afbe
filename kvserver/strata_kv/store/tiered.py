"""The tiered store: L1 DRAM in front of L2 (filesystem and/or S3), write-behind, promotion on hit."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from ..config import KVServerConfig
from .fstier import FsTier
from .kvevents import EventPublisher, parse_block_key
from .l2 import L2Tier
from .memory import MemoryTier
from .offload_stats import OffloadStats
from .policy import make_policy
from .s3tier import S3Tier
from .writebehind import Sink, WriteBehind

log = logging.getLogger(__name__)

_T = TypeVar("_T")


PREFIX_L2_BATCH = 8
"""Chunks of a chain whose tiers are looked for at once after the first. Past L1 each lookup is a file stat or an
S3 HEAD, so a chain whose chunks are only in S3 costs a round trip per batch, not per chunk (8 chunks one after
another could pass an engine's 1-s lookup timeout on a busy node); a chain that misses at its first chunk, the
usual miss, still costs one."""


def prefix_batches(count: int) -> Iterator[range]:
    """Index ranges of a chain of `count` chunks looked up together: the first alone, then PREFIX_L2_BATCH at a
    time."""
    yield range(min(1, count))
    for start in range(1, count, PREFIX_L2_BATCH):
        yield range(start, min(start + PREFIX_L2_BATCH, count))


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
        sinks: list[tuple[str, Sink]] = [(tier.name, self._l2_batched(tier.put)) for tier in self.l2]
        wb = cfg.write_behind
        self.write_behind = WriteBehind(sinks, wb.queue_items, wb.queue_bytes, wb.workers) if sinks else None
        self.namespace_drops = asyncio.Lock()
        """One namespace drop at a time (`namespaces.drop_namespace`): each counts what it found before deleting,
        so two at once (two operator replicas, or a reconcile beside the operator) would both count one block."""
        self.counters: Counter[str] = Counter()
        self.offload = OffloadStats(l1.size)
        """Bytes, seconds and unread chunks for the operator's offload verdict (`offload_stats.py`)."""
        self.events: EventPublisher | None = EventPublisher(cfg.events) if cfg.events.publish else None
        """KV events for vLLM-tier blocks, per medium (`events.medium`); None unless `events.publish`."""
        self._l2_changes: deque[tuple[L2Tier, bytes, bool]] = deque()
        """What L2 tiers reported from their threads, in their order, for the event loop to publish."""
        self._l2_changes_lock = threading.Lock()
        self._l2_changes_scheduled = False
        self._l2_batch = threading.local()
        """`active` in a worker thread running one L2 call whose reports go out together when it ends."""
        self._announce_task: asyncio.Task[None] | None = None
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
                tier.on_change = self._l2_reporter(tier)
            self.events.cleared()  # what a previous process announced is void; L2 blocks are announced again below
        for tier in self.l2:
            await asyncio.to_thread(tier.prepare)
        if self.events is not None and self.l2:
            self._announce_task = asyncio.create_task(self._announce_l2())
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
                await asyncio.to_thread(self._l2_batched(tier.rescan))
            except tier.read_failure as e:
                log.warning("L2 %s rescan failed: %s", tier.name, e)

    async def close(self) -> bool:
        """Drain the write-behind queue (bounded by the configured timeout); True if fully drained."""
        self.ready = False
        for task in [*self._rescan_tasks, *([self._announce_task] if self._announce_task else [])]:
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
    # Per medium: a tier's write is a BlockStored for its medium (`events.medium.of(tier)`); a block a tier let go
    # (eviction, DEL, a corrupt file) is a BlockRemoved for that medium unless another tier of the same medium still
    # holds it. L1 events are decided on the event loop as L1 changes; L2 tiers report from their threads, in their
    # index's order, and the loop publishes those reports in that order (where L1 state is read consistently).
    def _holds_elsewhere(self, source: str, key: bytes, medium: str) -> bool:
        """Does a tier other than `source` whose events name `medium` hold `key`? No I/O."""
        media = self.cfg.events.medium
        if source != "l1" and media.l1 == medium and key in self.l1:
            return True
        return any(t.name != source and media.l2 == medium and t.holds(key) for t in self.l2)

    def _tier_dropped(self, tier: str, keys: list[bytes]) -> None:
        """`tier` no longer holds `keys`: removed from its medium where no other tier of that medium has them."""
        if self.events is None:
            return
        medium = self.cfg.events.medium.of(tier)
        for key in keys:
            if not self._holds_elsewhere(tier, key, medium):
                self.events.removed(key, medium)

    def _l2_reporter(self, tier: L2Tier) -> Callable[[bytes, bool], None]:
        """The `on_change` of an L2 tier (called from its threads, under its lock): queue the report, and wake the
        loop once for all reports queued meanwhile (a watermark sweep is one wake-up, not one per file)."""

        def report(key: bytes, held: bool) -> None:
            with self._l2_changes_lock:
                self._l2_changes.append((tier, key, held))
            if not getattr(self._l2_batch, "active", False):
                self._schedule_l2_publish()

        return report

    def _schedule_l2_publish(self) -> None:
        with self._l2_changes_lock:
            if self._l2_changes_scheduled or not self._l2_changes or self._loop is None:
                return
            self._l2_changes_scheduled = True
        with contextlib.suppress(RuntimeError):  # the loop has closed (a write still running at shutdown)
            self._loop.call_soon_threadsafe(self._publish_l2_changes)

    def _l2_batched(self, call: Callable[..., _T]) -> Callable[..., _T]:
        """`call` (run in a worker thread) with the reports of its tier published when it returns, together: a
        watermark sweep inside a write, or a DEL of many keys, goes out as a few messages, not one per block."""

        def batched(*args: Any) -> _T:
            self._l2_batch.active = True
            try:
                return call(*args)
            finally:
                self._l2_batch.active = False
                self._schedule_l2_publish()

        return batched

    def _publish_l2_changes(self) -> None:
        with self._l2_changes_lock:
            changes = list(self._l2_changes)
            self._l2_changes.clear()
            self._l2_changes_scheduled = False
        if self.events is None:
            return
        for tier, key, held in changes:
            if held:
                self.events.stored(key, self.cfg.events.medium.of(tier.name))
            else:
                self._tier_dropped(tier.name, [key])

    async def _announce_l2(self) -> None:
        """At start, a BlockStored for each block the L2 indexes found on disk (after the AllBlocksCleared), paced
        to the event queue's room so that a large disk drops nothing. A block is announced only if its tier still
        holds it when its turn comes: its eviction since then was (or will be) published after this."""
        assert self.events is not None
        room = max(1, self.cfg.events.queue_max // 2)
        for tier in self.l2:
            medium = self.cfg.events.medium.of(tier.name)
            keys = await asyncio.to_thread(tier.block_keys)
            for i, key in enumerate(keys or ()):
                while self.events.depth >= room:
                    await asyncio.sleep(0.05)
                if i % 1024 == 1023:
                    await asyncio.sleep(0)  # let commands run between slices of a large index
                if tier.holds(key):
                    self.events.stored(key, medium)
                    self.counters["events_announced"] += 1

    def block_keys(self, tier: str) -> list[bytes]:
        """The vLLM-tier block keys `tier` holds (`l1`, `fs`): what its medium's KV events add up to."""
        if tier == "l1":
            return [key for key in self.l1.held_keys() if parse_block_key(key) is not None]
        for l2 in self.l2:
            if l2.name == tier:
                keys = l2.block_keys()
                if keys is None:
                    raise ValueError(f"the {tier} tier keeps no index to list")
                return keys
        names = ", ".join(["l1", *(t.name for t in self.l2)])
        raise ValueError(f"no tier {tier!r} on this server (it has {names})")

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
            self._missed([key], time.perf_counter() - started)
            return None
        self.counters[f"hits_{tier}"] += 1
        self._promote(key, value)
        self.offload.hit(key, tier, len(value), time.perf_counter() - started)
        return value

    async def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """Each key's value, as `get` reads and counts it; what L1 holds at once, the rest from L2 side by side.
        One after another, a job's chunks from S3 would take the sum of their latencies before the first byte of
        the reply, and the client's timeout bounds each receive (STRATA.MGETSIZED)."""
        values: list[bytes | None] = []
        later: list[int] = []
        for i, key in enumerate(keys):
            if key in self.l1:
                values.append(await self.get(key))  # an L1 hit: no suspension between the check and the read
            else:
                values.append(None)
                later.append(i)
        if later:
            for i, value in zip(later, await asyncio.gather(*(self.get(keys[i]) for i in later)), strict=True):
                values[i] = value
        return values

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
            evicted = self.l1.put(key, value)
        except MemoryError:
            return  # too large or L1 pinned full: serve it without caching
        self.counters["promotions"] += 1
        if self.events is not None:
            self.events.stored(key, self.cfg.events.medium.l1)
            self._tier_dropped("l1", evicted)

    async def exists(self, key: bytes, *, lookup: bool = False) -> bool:
        """Present in any tier. An L1 hit is pinned for the grace period (LMCache GETs right after).

        `lookup`: a client asks before it GETs (LMCache's EXISTS), so an absent key is a miss in the counters:
        that client never GETs it. SET NX's own check is not a lookup."""
        if key in self.l1:
            self.l1.pin(key)
            return True
        if self.write_behind and key in self.write_behind.pending:
            return True
        started = time.perf_counter()
        found = (await self.locate(key)) != ""
        if lookup and not found:
            self._missed([key], time.perf_counter() - started)
        return found

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

        Teaches L1 the chain (parent -> child links), and pins the L1 part for the grace period. Every chunk
        past the leading ones is a miss in the counters: the engine recomputes them and never GETs them (the
        found ones are counted as hits by their GETs), so without this the offload verdict saw hits only.
        """
        started = time.perf_counter()
        tiers: list[str] = []
        prev: bytes | None = None
        for batch in prefix_batches(len(keys)):
            located = await asyncio.gather(*(self.locate(keys[i]) for i in batch))
            for i, tier in zip(batch, located, strict=True):
                if not tier:
                    break
                if tier == "l1":
                    self.l1.pin(keys[i])
                    if prev is not None:
                        self.l1.link(prev, keys[i])
                tiers.append(tier)
                prev = keys[i]
            if len(tiers) < batch.stop:
                break
        if len(tiers) < len(keys):
            self._missed(keys[len(tiers) :], time.perf_counter() - started)
        return tiers

    def _missed(self, keys: Sequence[bytes], seconds: float) -> None:
        """Count lookups that found nothing; `seconds` (what finding nothing took) is shared among them."""
        self.counters["misses"] += len(keys)
        share = seconds / len(keys)
        for key in keys:
            self.offload.missed(share, self.l1.policy.ghost_distance(key))

    # -- writes -----------------------------------------------------------------------------------
    def get_nowait(self, key: bytes, max_size: int) -> bytes | None:
        """An L1 (or write-behind) hit of at most `max_size` bytes without leaving the event loop; None means: use
        `get`. Nothing is counted (nor shown to the eviction policy) unless the value is returned: a value the
        fast path cannot send goes through `get`, which counts it once."""
        started = time.perf_counter()
        value = self.l1.peek(key)
        in_l1 = value is not None
        if value is None and self.write_behind is not None:
            value = self.write_behind.pending.get(key)
        if value is None or len(value) > max_size:
            return None
        if in_l1:
            self.l1.get(key)  # the access, for the eviction policy
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
        had = key in self.l1
        try:
            evicted = self.l1.put(key, value, parent)
        except MemoryError as e:
            if self.write_behind:
                self.l1.delete(key)  # an older value must not shadow the new one
            if had and key not in self.l1:  # put drops the older value before it may refuse the new one
                self._tier_dropped("l1", [key])
            if not self.write_behind:
                raise StoreFull(str(e)) from e
            return  # L2 alone will hold it: its medium's BlockStored comes with the write
        if self.events is not None:
            self.events.stored(key, self.cfg.events.medium.l1)
            self._tier_dropped("l1", evicted)

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
        return (await self.delete_many([key]))[0]

    async def delete_many(self, keys: list[bytes]) -> list[bool]:
        """DEL, and every other removal of keys (e.g. a namespace's blocks): which keys some tier held (a key given
        twice counts once, as Redis' DEL). One pass per tier, each L2 tier in one worker thread, so every tier
        reports its removals together: KV events publish a BlockRemoved for each medium that held each block, in
        few messages."""
        found = [self.l1.delete(key) for key in keys]
        self._tier_dropped("l1", [key for key, held in zip(keys, found, strict=True) if held])
        if self.write_behind:
            for i, key in enumerate(keys):
                if key in self.write_behind.pending:
                    self.write_behind.discard(key)
                    found[i] = True
            for key in keys:
                await self.write_behind.wait_written(key)  # a late write must not undo the DEL
        for tier in self.l2:
            deleted = await asyncio.to_thread(self._l2_batched(_delete_from), tier, keys)
            found = [a or b for a, b in zip(found, deleted, strict=True)]
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
            "l1_new_chunk_share_bytes": self.l1.policy.hir_bytes,
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
            out["events_announced"] = self.counters["events_announced"]
            out["events_announcing"] = int(self._announce_task is not None and not self._announce_task.done())
        for tier in self.l2:  # write errors come from the write-behind counters above
            out.update({f"{tier.name}_{k}": v for k, v in tier.stats().items() if k != "write_errors"})
        return out


def _delete_from(tier: L2Tier, keys: list[bytes]) -> list[bool]:
    """Delete `keys` from one L2 tier (in a worker thread); a failing delete is logged and counts as not found."""
    out = []
    for key in keys:
        try:
            out.append(tier.delete(key))
        except tier.read_failure as e:
            log.warning("L2 %s delete failed: %s", tier.name, e)
            out.append(False)
    return out
