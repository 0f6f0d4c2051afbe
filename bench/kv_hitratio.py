"""Hit ratio of the KV server's L1 policies on the measured workloads, beside the offline optimum.

Replays requests the way vLLM + a KV tier see them: a request is a document split into a chain of
chunks; the leading resident chunks are hits (a chunk counts only if every earlier chunk hit), the
rest are recomputed and stored. Workloads: 10 documents read cyclically with L1 at 0.5-2x the working
set; Zipf s=1 over 60 documents; users who arrive and leave (8 talk at once, each about a document of its
own for 6 turns, then a new user takes its place: the working set moves on); and Zipf with half the
requests one-off documents (a scan through the popular ones). Policies run in the server's real
`MemoryTier`; Belady (evict the chunk used furthest in the future) is the offline reference.

    .venv/bin/python bench/kv_hitratio.py [--chunks-per-doc 20] [--requests 3000] [--markdown]
"""

from __future__ import annotations

import argparse
import contextlib
import heapq
import random
from collections.abc import Callable, Iterable

from strata_kv.store.memory import MemoryTier
from strata_kv.store.policy import EvictionPolicy, LRUPolicy, PrefixLIRSPolicy

Chunk = tuple[int, int]  # (document, position in its chain)

CHUNK_BYTES = 2**20
"""What one chunk's value counts against L1 here (256 tokens of a small model): capacities are given in chunks and
counted in bytes, so the policy's byte budgets (its ghosts' share of the capacity) see the sizes a server sees."""
VALUE = bytes(CHUNK_BYTES)


def chunk_tier(chunks: int, policy: Callable[[int], EvictionPolicy]) -> MemoryTier:
    """An L1 holding `chunks` chunks, each costing its value's bytes (keys and entry overhead left out, so that
    capacities read as whole chunks)."""
    capacity = chunks * CHUNK_BYTES
    return MemoryTier(capacity, policy(capacity), cost=lambda key, value: len(value))


def cyclic(docs: int, rounds: int) -> list[int]:
    return [d for _ in range(rounds) for d in range(docs)]


def zipf(docs: int, requests: int, s: float = 1.0, seed: int = 7) -> list[int]:
    rng = random.Random(seed)
    weights = [1.0 / (rank**s) for rank in range(1, docs + 1)]
    order = list(range(docs))
    rng.shuffle(order)  # popularity is not tied to document id
    return [order[i] for i in rng.choices(range(docs), weights=weights, k=requests)]


def arrivals(active: int, turns: int, requests: int, seed: int = 11) -> list[int]:
    """`active` users talk at once, each about a document of its own for `turns` requests in all; then it leaves
    and a new user (a new document) arrives."""
    rng = random.Random(seed)
    left = dict.fromkeys(range(active), turns)
    arrived = active
    trace = []
    while len(trace) < requests:
        doc = rng.choice(sorted(left))
        trace.append(doc)
        left[doc] -= 1
        if not left[doc]:
            del left[doc]
            left[arrived] = turns
            arrived += 1
    return trace


def with_one_offs(trace: list[int], share: float, seed: int = 5) -> list[int]:
    """`trace` with each request replaced, with probability `share`, by a document asked for once and never again."""
    rng = random.Random(seed)
    once = 1 << 30
    out = []
    for doc in trace:
        if rng.random() < share:
            out.append(once)
            once += 1
        else:
            out.append(doc)
    return out


def replay(trace: list[int], chunks_per_doc: int, capacity: int, tier: MemoryTier, chains: bool = True) -> float:
    """Fraction of requested chunks that were prefix hits."""
    hits = total = 0
    for doc in trace:
        prefix_ok = True
        parent: Chunk | None = None
        for pos in range(chunks_per_doc):
            key = (doc, pos)
            total += 1
            if prefix_ok and tier.get(key) is not None:  # type: ignore[arg-type]
                hits += 1
            else:
                prefix_ok = False
                with contextlib.suppress(MemoryError):  # NotAdmitted: the policy kept colder chunks out
                    tier.put(key, VALUE, parent if chains else None)  # type: ignore[arg-type]
            parent = key
    return hits / total


def belady(trace: list[int], chunks_per_doc: int, capacity: int) -> float:
    """Offline optimum reference: on a miss, evict the resident chunk needed furthest in the future."""
    accesses = [(doc, pos) for doc in trace for pos in range(chunks_per_doc)]
    next_use = [0] * len(accesses)
    last_seen: dict[Chunk, int] = {}
    for i in range(len(accesses) - 1, -1, -1):
        next_use[i] = last_seen.get(accesses[i], 1 << 60)
        last_seen[accesses[i]] = i
    resident: dict[Chunk, int] = {}  # chunk -> its next use
    heap: list[tuple[int, Chunk]] = []
    hits = 0
    prefix_ok = True
    for i, key in enumerate(accesses):
        if key[1] == 0:
            prefix_ok = True
        if key in resident:
            hits += prefix_ok
        else:
            prefix_ok = False
            if len(resident) >= capacity:
                while True:
                    neg, victim = heapq.heappop(heap)
                    if resident.get(victim) == -neg:
                        del resident[victim]
                        break
        resident[key] = next_use[i]
        heapq.heappush(heap, (-next_use[i], key))
    return hits / len(accesses)


POLICIES: dict[str, Callable[[int], EvictionPolicy]] = {
    "LRU": lambda capacity: LRUPolicy(),
    "prefix-lirs (default)": lambda capacity: PrefixLIRSPolicy(capacity),
}


def rows(trace: list[int], chunks_per_doc: int, working_set: int, ratios: Iterable[float]) -> list[list[str]]:
    out = []
    for ratio in ratios:
        cap = max(1, int(working_set * ratio))
        row = [f"{ratio:.2f}x ({cap} chunks)"]
        for make in POLICIES.values():
            row.append(f"{replay(trace, chunks_per_doc, cap, chunk_tier(cap, make)):.3f}")
        no_chain = chunk_tier(cap, PrefixLIRSPolicy)
        row.append(f"{replay(trace, chunks_per_doc, cap, no_chain, chains=False):.3f}")
        row.append(f"{belady(trace, chunks_per_doc, cap):.3f}")
        out.append(row)
    return out


def table(title: str, body: list[list[str]], markdown: bool) -> str:
    head = ["L1 size / working set", *POLICIES, "default, chains unknown", "Belady (offline)"]
    if markdown:
        lines = [f"**{title}**", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(r) + " |" for r in body]
        return "\n".join(lines) + "\n"
    widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join([title, fmt.format(*head), *(fmt.format(*r) for r in body)]) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunks-per-doc", type=int, default=20, help="chunks per document (5k tokens / 256)")
    ap.add_argument("--rounds", type=int, default=30, help="passes over the 10 cyclic documents")
    ap.add_argument("--requests", type=int, default=3000, help="Zipf requests")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    c = args.chunks_per_doc
    cyc = cyclic(10, args.rounds)
    print(table("Cyclic, 10 documents (prefix hit ratio)", rows(cyc, c, 10 * c, (0.5, 0.75, 0.9, 1.0, 1.1, 1.5, 2.0)),
                args.markdown))  # fmt: skip
    zf = zipf(60, args.requests)
    print(table("Zipf s=1, 60 documents (prefix hit ratio)", rows(zf, c, 60 * c, (0.1, 0.25, 0.5, 0.75)),
                args.markdown))  # fmt: skip
    moving = arrivals(8, 6, args.requests)
    print(table("Users who arrive and leave: 8 at once, 6 turns each (prefix hit ratio)",
                rows(moving, c, 8 * c, (0.5, 0.75, 1.0, 1.5, 2.0, 4.0)), args.markdown))  # fmt: skip
    print(table("Zipf s=1, 60 documents, half the requests one-off documents (prefix hit ratio)",
                rows(with_one_offs(zf, 0.5), c, 60 * c, (0.1, 0.25, 0.5, 1.0)), args.markdown))  # fmt: skip


if __name__ == "__main__":
    main()
