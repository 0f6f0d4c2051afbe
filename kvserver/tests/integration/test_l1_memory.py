"""L1's bound holds in the server's real memory (RSS): tiny values and floods of large-key misses."""

import psutil
import pytest

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


def test_server_rss_stays_near_the_l1_bound(kv_server_factory) -> None:
    server = kv_server_factory({"l1": {"size": "8MiB"}}, l2_fs=False)
    assert server.process is not None
    proc = psutil.Process(server.process.pid)
    r = server.redis()
    r.set("warm", b"x")
    baseline = proc.memory_info().rss
    pipe = r.pipeline(transaction=False)
    for i in range(60_000):  # 1-byte values: the bound used to count 60 KB of them
        pipe.set(b"model@1@0@%016x@bfloat16" % i, b"v")
        if i % 2000 == 1999:
            pipe.execute()
    pipe.execute()
    after_sets = proc.memory_info().rss
    stats = server.client().stats()
    assert stats["l1_used_bytes"] <= 8 * MiB
    assert after_sets - baseline < 24 * MiB, f"RSS grew {(after_sets - baseline) / MiB:.0f} MiB for an 8 MiB L1"
    for start in range(0, 10_000, 500):  # 40 MB of distinct 4,000-byte keys, each a miss
        for i in range(start, start + 500):
            pipe.get(b"%08d" % i + b"k" * 3992)
        assert pipe.execute() == [None] * 500
    after_misses = proc.memory_info().rss
    assert after_misses - after_sets < 16 * MiB, f"misses grew RSS {(after_misses - after_sets) / MiB:.0f} MiB"
