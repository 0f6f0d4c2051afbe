"""What the operator needs to judge whether offloading pays: bytes stored and loaded, time spent serving hits
and misses and stores, chunks stored that nobody read, and the hits a larger L1 would have had.

Kept apart from the store so the hot path only bumps integers and reads a clock; the counters are exported on
/metrics (`server/metrics.py`) and judged by the operator (`strata_operator.resources.kvcachetier.offload`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client.core import CounterMetricFamily

GHOST_FACTORS = (1.25, 1.5, 2.0, 3.0, 4.0)
"""L1 sizes, as multiples of the configured one, that a ghost hit is attributed to: a miss on a key the policy
evicted `d` bytes of evictions ago would have hit in an L1 at least `d` bytes larger."""

UNREAD_SWEEP_MIN = 4096
"""The unread-key set is swept (keys L1 no longer holds leave it) once it holds this many more keys than L1."""


def ghost_factor_label(factor: float) -> str:
    """The `l1_size_factor` label value: `1.25`, `2` (no trailing zeros, so queries stay short)."""
    return f"{factor:g}"


@dataclass
class OffloadStats:
    """Counters of one server since it started (the operator takes deltas between scrapes)."""

    capacity: int
    """L1 bytes, to turn a ghost's reuse distance into a factor of the configured size."""
    clock: Callable[[], float] = time.perf_counter
    stored_bytes: int = 0
    loaded_bytes: dict[str, int] = field(default_factory=lambda: {"l1": 0, "fs": 0, "s3": 0})
    load_seconds: dict[str, float] = field(default_factory=lambda: {"l1": 0.0, "fs": 0.0, "s3": 0.0})
    miss_seconds: float = 0.0
    store_seconds: float = 0.0
    first_reads: int = 0
    """Chunks read for the first time since they were stored (while L1 still held them)."""
    evicted_unread: int = 0
    """Chunks that left L1 (evicted, or replaced by a new SET of the key) without a single read since stored."""
    ghost_hits: dict[float, int] = field(default_factory=lambda: dict.fromkeys(GHOST_FACTORS, 0))
    """Cumulative: misses an L1 `factor` times larger would have answered (like a histogram's `le` buckets)."""
    _unread: set[bytes] = field(default_factory=set, repr=False)

    def stored(self, key: bytes, size: int, seconds: float) -> None:
        self.stored_bytes += size
        self.store_seconds += seconds
        if key in self._unread:  # the copy stored before was never read (it may have left L1 meanwhile)
            self.evicted_unread += 1
        else:
            self._unread.add(key)

    def hit(self, key: bytes, tier: str, size: int, seconds: float) -> None:
        self.loaded_bytes[tier] += size
        self.load_seconds[tier] += seconds
        if self._unread:
            try:
                self._unread.remove(key)
            except KeyError:
                return
            self.first_reads += 1

    def missed(self, seconds: float, ghost_distance: int | None) -> None:
        self.miss_seconds += seconds
        if ghost_distance is not None:
            for factor in GHOST_FACTORS:
                if ghost_distance <= (factor - 1.0) * self.capacity:
                    self.ghost_hits[factor] += 1

    def sweep(self, resident: Callable[[bytes], bool], resident_count: int, force: bool = False) -> None:
        """Forget unread keys L1 let go, counting them; amortized O(1): runs when the set outgrows L1 by half
        again (or `force`, at a scrape)."""
        if not force and len(self._unread) < resident_count + resident_count // 2 + UNREAD_SWEEP_MIN:
            return
        gone = [key for key in self._unread if not resident(key)]
        self.evicted_unread += len(gone)
        self._unread.difference_update(gone)


def metric_families(stats: OffloadStats) -> Iterator[CounterMetricFamily]:
    """The `strata_kv_offload_*` families of /metrics (read at scrape time)."""
    yield CounterMetricFamily(
        "strata_kv_offload_stored_bytes",
        "Bytes of chunks stored (SET), for the offload verdict",
        value=stats.stored_bytes,
    )
    loaded = CounterMetricFamily(
        "strata_kv_offload_loaded_bytes", "Bytes of chunks served by hits, by tier", labels=["tier"]
    )
    load = CounterMetricFamily(
        "strata_kv_offload_load_seconds",
        "Seconds spent serving hits (lookup to value in hand), by tier",
        labels=["tier"],
    )
    for tier in sorted(stats.loaded_bytes):
        loaded.add_metric([tier], stats.loaded_bytes[tier])
        load.add_metric([tier], stats.load_seconds[tier])
    yield loaded
    yield load
    yield CounterMetricFamily(
        "strata_kv_offload_miss_seconds", "Seconds spent on lookups no tier could answer", value=stats.miss_seconds
    )
    yield CounterMetricFamily(
        "strata_kv_offload_store_seconds", "Seconds spent storing chunks", value=stats.store_seconds
    )
    yield CounterMetricFamily(
        "strata_kv_offload_first_reads", "Stored chunks read for the first time (while in L1)", value=stats.first_reads
    )
    yield CounterMetricFamily(
        "strata_kv_offload_evicted_unread",
        "Chunks that left L1 (evicted or replaced) never read since stored",
        value=stats.evicted_unread,
    )
    ghosts = CounterMetricFamily(
        "strata_kv_offload_ghost_hits",
        "Misses an L1 this many times larger would have answered (cumulative over l1_size_factor)",
        labels=["l1_size_factor"],
    )
    for factor in GHOST_FACTORS:
        ghosts.add_metric([ghost_factor_label(factor)], stats.ghost_hits[factor])
    yield ghosts
