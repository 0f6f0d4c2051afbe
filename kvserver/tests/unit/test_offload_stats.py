"""The counters behind the operator's offload verdict: unread chunks, first reads, ghost hits by L1 size."""

from __future__ import annotations

from strata_kv.store.memory import MemoryTier
from strata_kv.store.offload_stats import GHOST_FACTORS, OffloadStats, ghost_factor_label
from strata_kv.store.policy import LRUPolicy, PrefixLIRSPolicy


def test_a_chunk_read_once_counts_one_first_read_and_later_reads_none() -> None:
    stats = OffloadStats(capacity=1000)
    stats.stored(b"a", 10, 0.001)
    stats.stored(b"b", 10, 0.001)
    stats.hit(b"a", "l1", 10, 0.002)
    stats.hit(b"a", "l1", 10, 0.002)
    assert stats.first_reads == 1
    assert stats.loaded_bytes["l1"] == 20 and stats.stored_bytes == 20
    assert round(stats.load_seconds["l1"], 6) == 0.004


def test_chunks_l1_let_go_unread_are_counted_at_the_sweep() -> None:
    stats = OffloadStats(capacity=1000)
    for key in (b"a", b"b", b"c"):
        stats.stored(key, 10, 0.0)
    stats.hit(b"b", "l1", 10, 0.0)
    resident = {b"c"}
    stats.sweep(resident.__contains__, len(resident))  # small: not due yet
    assert stats.evicted_unread == 0
    stats.sweep(resident.__contains__, len(resident), force=True)
    assert stats.evicted_unread == 1  # a (b was read; c is still resident)
    stats.hit(b"c", "l1", 10, 0.0)
    assert stats.first_reads == 2
    stats.stored(b"d", 10, 0.0)
    stats.stored(b"d", 10, 0.0)  # stored again before anyone read it (or after L1 let it go unread)
    assert stats.evicted_unread == 2


def test_a_miss_on_a_ghost_is_attributed_to_every_l1_size_that_would_have_kept_it() -> None:
    stats = OffloadStats(capacity=1000)
    stats.missed(0.001, 400)  # 1.5x (500 more bytes) and up would have hit; 1.25x (250 more) would not
    stats.missed(0.001, None)
    assert [stats.ghost_hits[f] for f in GHOST_FACTORS] == [0, 1, 1, 1, 1]
    assert [ghost_factor_label(f) for f in GHOST_FACTORS] == ["1.25", "1.5", "2", "3", "4"]


def test_lirs_ghost_distance_is_the_bytes_evicted_since_the_key_left() -> None:
    size, capacity = 10_000, 100_000  # ten chunks; ghosts may cost 5% of the capacity
    l1 = MemoryTier(capacity, PrefixLIRSPolicy(capacity), cost=lambda k, v: len(v))
    for i in range(12):  # two chunks more than L1 holds: 9 and 10 pass through the cold slot and leave
        l1.put(i.to_bytes(2, "big"), b"x" * size)
    assert l1.get(b"\x00\x09") is None
    # 9 and then 10 were evicted since 9 left: an L1 two chunks larger would have kept it.
    assert l1.policy.ghost_distance(b"\x00\x09") == 2 * size
    assert l1.policy.ghost_distance(b"\x00\x0b") is None  # resident
    assert l1.policy.ghost_distance(b"\x00\x63") is None  # never seen


def test_lru_keeps_no_ghosts() -> None:
    assert LRUPolicy().ghost_distance(b"k") is None


def test_a_chain_is_looked_up_first_chunk_alone_then_eight_at_a_time() -> None:
    from strata_kv.store.tiered import prefix_batches

    assert [list(r) for r in prefix_batches(0)] == [[]]
    assert [list(r) for r in prefix_batches(1)] == [[0]]
    assert [(r.start, r.stop) for r in prefix_batches(20)] == [(0, 1), (1, 9), (9, 17), (17, 20)]
