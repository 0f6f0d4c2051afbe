"""Eviction policies: the byte bound always holds, LRU hits the cliff, the default does not, tails go first."""

import sys
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from strata_kv.store.memory import MemoryTier, entry_cost
from strata_kv.store.policy import LRUPolicy, PrefixLIRSPolicy, make_policy

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from kv_hitratio import arrivals  # the hit-ratio bench's workload: users who come and go


def value_bytes(key: bytes, value: bytes) -> int:
    """Policy tests count value bytes only, so capacities read as numbers of small chunks."""
    return len(value)


def tier(policy: str, capacity: int, grace: float = 0.0, clock=None, cost=value_bytes) -> MemoryTier:
    kwargs = {"clock": clock} if clock else {}
    return MemoryTier(capacity, make_policy(policy, capacity), grace_seconds=grace, cost=cost, **kwargs)


ops = st.lists(
    st.tuples(st.sampled_from(["put", "get", "del", "pin"]), st.integers(0, 40), st.integers(1, 300)),
    max_size=300,
)


@settings(max_examples=150, deadline=None)
@given(ops=ops, policy=st.sampled_from(["lru", "prefix-lirs"]), capacity=st.integers(1000, 8000))
def test_l1_never_holds_more_than_its_capacity(ops, policy: str, capacity: int) -> None:
    now = [0.0]
    t = tier(policy, capacity, grace=5.0, clock=lambda: now[0], cost=entry_cost)
    model: dict[bytes, bytes] = {}
    for i, (op, k, size) in enumerate(ops):
        now[0] = i * 0.5
        key = b"k%d" % k
        if op == "put":
            value = bytes([k % 256]) * size
            try:
                evicted = t.put(key, value, parent=b"k%d" % (k - 1) if k else None)
            except MemoryError:
                model.pop(key, None)
                continue
            for e in evicted:
                model.pop(e, None)
            model[key] = value
        elif op == "get":
            assert t.get(key) == model.get(key)
        elif op == "del":
            assert t.delete(key) == (key in model)
            model.pop(key, None)
        else:
            t.pin(key)
        assert t.used <= capacity
        assert t.used == sum(entry_cost(k, v) for k, v in model.items())
        assert len(t) == len(model)


def test_pinned_keys_survive_pressure_until_the_grace_period_ends() -> None:
    now = [0.0]
    t = tier("lru", 300, grace=10.0, clock=lambda: now[0])
    t.put(b"a", b"x" * 100)
    t.pin(b"a")
    for i in range(10):
        t.put(b"f%d" % i, b"y" * 100)
    assert b"a" in t
    now[0] = 11.0
    for i in range(10):
        t.put(b"g%d" % i, b"y" * 100)
    assert b"a" not in t


def loop_hits(policy, capacity_units: int, working_set: int, rounds: int = 20) -> int:
    t = MemoryTier(capacity_units, policy, cost=value_bytes)
    hits = 0
    for r in range(rounds):
        for i in range(working_set):
            key = b"%d" % i
            if t.get(key) is not None:
                hits += r > 2
            else:
                t.put(key, b"x")
    return hits


def test_lru_gets_zero_hits_on_a_loop_slightly_larger_than_the_cache() -> None:
    assert loop_hits(LRUPolicy(), 90, 100) == 0


def test_default_policy_keeps_hitting_on_that_loop() -> None:
    hits = loop_hits(PrefixLIRSPolicy(90), 90, 100)
    assert hits > 0.5 * 17 * 100  # measured ~0.85 per access in the published simulations


def test_chain_tail_is_evicted_before_its_head() -> None:
    policy = PrefixLIRSPolicy(1000, hir_fraction=0.5)
    t = MemoryTier(1000, policy, cost=value_bytes)
    t.put(b"warm", b"w" * 500)  # fills the protected (LIR) share
    t.put(b"h", b"x" * 100)
    t.put(b"m", b"x" * 100, parent=b"h")
    t.put(b"t", b"x" * 100, parent=b"m")
    evicted = t.put(b"other", b"x" * 290)
    assert evicted == [b"t"]
    assert b"h" in t and b"m" in t


def test_plain_lru_evicts_the_head_of_a_chain_first() -> None:
    t = MemoryTier(300, LRUPolicy(), cost=value_bytes)
    t.put(b"h", b"x" * 100)
    t.put(b"m", b"x" * 100, parent=b"h")
    t.put(b"t", b"x" * 100, parent=b"m")
    assert t.put(b"other", b"x" * 100) == [b"h"]


def test_value_larger_than_l1_is_refused_with_a_reason() -> None:
    t = tier("prefix-lirs", 100)
    try:
        t.put(b"big", b"x" * 101)
    except MemoryError as e:
        assert "larger than L1" in str(e)
    else:
        raise AssertionError("a value larger than L1 was accepted")


CHUNK = 4096
"""Chunks of a realistic size in the tests below: the policy's ghosts are budgeted in bytes against the capacity."""


def serve(t: MemoryTier, trace: list[int], chunks_per_doc: int = 4) -> int:
    """Replay requests as an engine does: the leading resident chunks of a document are hits (GET), the rest are
    computed and stored (SET); returns the hits."""
    hits = 0
    for doc in trace:
        parent = None
        found = True
        for pos in range(chunks_per_doc):
            key = b"%d/%d" % (doc, pos)
            found = found and key in t
            if found:
                t.get(key)
                hits += 1
            else:
                t.put(key, b"x" * CHUNK, parent)
            parent = key
    return hits


def test_users_who_arrive_take_the_place_of_users_who_left() -> None:
    capacity = 2 * 8 * 4 * (CHUNK + 1)  # twice what the active users' documents hold
    trace = arrivals(active=8, turns=6, requests=2000)
    lirs = serve(MemoryTier(capacity, PrefixLIRSPolicy(capacity), cost=value_bytes), trace)
    lru = serve(MemoryTier(capacity, LRUPolicy(), cost=value_bytes), trace)
    best = sum(1 for n, doc in enumerate(trace) if doc in trace[:n]) * 4  # every turn after the first hits
    assert lru > 0.95 * best
    # A fixed 5% share for new chunks kept the users who had left (LIR, never asked for again): 0.03 of LRU's.
    assert lirs > 0.95 * lru, f"prefix-lirs {lirs} hits, LRU {lru}, at most {best}"


def test_one_off_chunks_leave_the_protected_ones_and_the_share_alone() -> None:
    capacity = 40 * (CHUNK + 1)
    policy = PrefixLIRSPolicy(capacity)
    t = MemoryTier(capacity, policy, cost=value_bytes)
    popular = [0, 1, 2, 3, 4, 5] * 3
    serve(t, popular)
    share = policy.hir_bytes
    serve(t, list(range(100, 400)))  # 1,200 chunks read once: thirty times L1
    assert policy.hir_bytes == share
    assert serve(t, [0, 1, 2, 3, 4, 5]) == 24  # every popular chunk still resident
    lru = MemoryTier(capacity, LRUPolicy(), cost=value_bytes)
    serve(lru, popular)
    serve(lru, list(range(100, 400)))
    assert serve(lru, [0, 1, 2, 3, 4, 5]) == 0  # where LRU kept none of them


def test_the_share_grows_when_new_chunks_come_back_and_shrinks_when_protected_ones_do() -> None:
    capacity = 40 * (CHUNK + 1)
    policy = PrefixLIRSPolicy(capacity)
    t = MemoryTier(capacity, policy, cost=value_bytes)
    floor = policy.hir_bytes
    serve(t, [0, 1, 2, 3, 4, 5, 6, 7, 8] * 2)  # 36 chunks proven hot: LIR holds 38 chunks' bytes
    for doc in (20, 21, 22, 23):  # new users, each back after the others: evicted from the 5% share in between
        serve(t, [doc, doc + 10, doc + 20])
    serve(t, [20, 21, 22, 23])
    grown = policy.hir_bytes
    assert grown > floor
    assert grown <= capacity // 2  # MAX_HIR_FRACTION: half of L1 stays protected
    serve(t, [0, 1, 2, 3, 4, 5, 6, 7, 8])  # the first users come back: LIR lost some of theirs
    assert policy.hir_bytes < grown
