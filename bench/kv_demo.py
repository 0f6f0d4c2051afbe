"""Demo: a real strata-kv with a small L1 and a filesystem L2, replaying the cyclic, Zipf and arrivals workloads.

For each workload it starts two servers (the default policy and plain LRU), replays requests the
way an engine does (STRATA.PREFIX to find the resident prefix, GET those chunks, store the rest as
a chain) and prints the share of chunks served by each tier. LRU's L1 falls to zero on the loop;
the L2 catches what L1 lost either way.

    .venv/bin/python bench/kv_demo.py [--chunk-kib 64] [--chunks-per-doc 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testsupport"))

from kv_hitratio import arrivals, cyclic, zipf
from strata_kv.client import KVClient
from strata_testsupport.kvserver import running_kv_server


def replay(client: KVClient, trace: list[int], chunks_per_doc: int, chunk: bytes) -> Counter[str]:
    served: Counter[str] = Counter()
    for doc in trace:
        keys = [f"doc{doc}:chunk{i}" for i in range(chunks_per_doc)]
        tiers = client.prefix(keys)
        n_hit = 0
        for key, tier in zip(keys, tiers, strict=False):
            if client.get(key) is None:  # evicted between lookup and load: recompute from here
                break
            served[tier] += 1
            n_hit += 1
        rest = keys[n_hit:]
        if rest:
            client.put_chain([(k, chunk) for k in rest])
            if n_hit:
                client.call("STRATA.LINK", keys[n_hit - 1], rest[0])
        served["recomputed"] += len(rest)
        served["total"] += chunks_per_doc
    return served


def run(name: str, policy: str, trace: list[int], working_set: int, l1_ratio: float, args: argparse.Namespace) -> str:
    chunk = b"\xab" * (args.chunk_kib * 1024)
    l1_bytes = int(working_set * len(chunk) * l1_ratio)
    with tempfile.TemporaryDirectory(prefix="strata-kv-demo-") as tmp:
        config = {
            "l1": {"size": l1_bytes, "eviction_policy": policy, "exists_grace_seconds": 0},
            "metrics": {"port": -1},
        }
        with running_kv_server(Path(tmp), config) as server:
            client = server.client()
            served = replay(client, trace, args.chunks_per_doc, chunk)
            client.close()
    total = served["total"]
    return (
        f"{name:<28} {policy:<12} L1 {l1_ratio:.2f}x   "
        f"L1 {served['l1'] / total:.3f}   L2(fs) {served['fs'] / total:.3f}   "
        f"recomputed {served['recomputed'] / total:.3f}"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chunk-kib", type=int, default=64)
    ap.add_argument("--chunks-per-doc", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--requests", type=int, default=400)
    args = ap.parse_args()
    c = args.chunks_per_doc
    print("share of requested chunks served by each tier (higher L1 is better; L2 saves recompute)")
    for policy in ("prefix-lirs", "lru"):
        print(run("cyclic 10 docs", policy, cyclic(10, args.rounds), 10 * c, 0.9, args))
    for policy in ("prefix-lirs", "lru"):
        print(run("zipf s=1 60 docs", policy, zipf(60, args.requests), 60 * c, 0.25, args))
    for policy in ("prefix-lirs", "lru"):
        print(run("users who come and go", policy, arrivals(8, 6, args.requests), 8 * c, 1.0, args))


if __name__ == "__main__":
    main()
