"""L1's byte bound covers what its structures really use: keys, values and per-entry bookkeeping while every SET
evicts, and misses keep nothing however many distinct keys are asked for."""

import gc
import tracemalloc

from strata_kv.store.memory import MemoryTier
from strata_kv.store.policy import make_policy

CAPACITY = 2 * 1024 * 1024


TRACEBACK_FRAMES = 4
OURS = [tracemalloc.Filter(True, __file__, all_frames=True), tracemalloc.Filter(True, "*/strata_kv/*", all_frames=True)]
"""Only memory allocated under this test or the KV server's code counts: a thread some earlier test left behind
(the suite runs in one process) allocating meanwhile made the total flaky."""


def traced_growth(fill) -> tuple[int, object]:
    gc.collect()
    tracemalloc.start(TRACEBACK_FRAMES)
    try:
        before = tracemalloc.take_snapshot().filter_traces(OURS)
        kept = fill()
        gc.collect()
        after = tracemalloc.take_snapshot().filter_traces(OURS)
    finally:
        tracemalloc.stop()
    return sum(stat.size_diff for stat in after.compare_to(before, "filename")), kept


def test_many_tiny_values_stay_within_the_l1_bound() -> None:
    for policy in ("prefix-lirs", "lru"):

        def fill(policy: str = policy) -> MemoryTier:
            t = MemoryTier(CAPACITY, make_policy(policy, CAPACITY))
            parent = None
            for i in range(30_000):  # 1-byte values: the bound used to count 30 KB of them
                key = b"model@1@0@%016x@bfloat16" % i
                t.put(key, b"v", parent)  # linked as consecutive SETs on one connection are; once full, each evicts
                t.get(key)
                parent = key if i % 32 else None  # requests of 32 chunks, each one chain
            return t

        used, tier = traced_growth(fill)
        assert isinstance(tier, MemoryTier)
        assert tier.used <= CAPACITY
        assert used <= CAPACITY * 1.15, f"{policy}: {used} bytes traced for a {CAPACITY}-byte L1"


def test_get_misses_of_large_keys_keep_nothing() -> None:
    capacity = 64 * 1024 * 1024
    t = MemoryTier(capacity, make_policy("prefix-lirs", capacity))
    for i in range(10_000):  # many residents
        t.put(b"resident%d" % i, b"x" * 100)

    def misses() -> None:
        for i in range(20_000):  # 80 MB of distinct keys, each asked for once
            assert t.get(b"%08d" % i + b"k" * 3992) is None

    used, _ = traced_growth(misses)
    assert used < 1024 * 1024, f"{used} bytes kept after 20k misses"
