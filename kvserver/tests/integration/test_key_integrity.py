"""Keys that differ as bytes keep separate L2 storage through a real server (L1 tiny, so values live in L2)."""

import hashlib
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

PAIRS = [
    (b"llama@2@1@DEADBEEF01@bfloat16", b"llama@2@1@deadbeef01@bfloat16"),
    (b"llama@2@1@1@bfloat16", b"llama@2@1@00001@bfloat16"),
    (b"llama@1@2@abcdef@salt", b"llama@0001@00002@abcdef@salt"),
    (hashlib.sha256(b"tokens").digest() + bytes(4), b"tokens"),
]


def test_aliased_key_pairs_round_trip_independently_through_l2(kv_server_factory) -> None:
    server = kv_server_factory({"l1": {"size": 1}, "write_behind": {"workers": 1}})
    r = server.redis()
    for a, b in PAIRS:
        r.set(a, b"A:" + a)
        r.set(b, b"B:" + b)
    c = server.client()
    deadline = time.monotonic() + 30
    while c.stats()["write_behind_depth"] and time.monotonic() < deadline:  # every value on disk, none in L1
        time.sleep(0.05)
    assert c.stats()["l1_keys"] == 0
    for a, b in PAIRS:
        assert r.exists(a) == 1 and r.exists(b) == 1
        assert r.get(a) == b"A:" + a, a
        assert r.get(b) == b"B:" + b, b
        assert r.delete(b) == 1
        assert r.exists(b) == 0 and r.get(b) is None
        assert r.exists(a) == 1 and r.get(a) == b"A:" + a, a
        assert r.delete(a) == 1 and r.exists(a) == 0
    assert c.stats()["hits_fs"] >= 2 * len(PAIRS)


def test_sets_and_dels_through_a_server_leave_no_directories_behind(kv_server_factory) -> None:
    server = kv_server_factory({"l1": {"size": 1}})
    r = server.redis()
    keys = [b"llama@8@%d@%012x@bfloat16" % (i % 8, i * 104729) for i in range(300)]
    keys += [b"spray@%d@%d@abc@x" % (i + 100, i + 99) for i in range(100)]  # ranks past max_ranks
    keys += [b"plain-%d" % i for i in range(100)]
    for k in keys:
        r.set(k, b"v")
    root = Path(server.config["l2"]["fs"]["root_dir"])
    assert sum(1 for top in root.iterdir() if "_r" in top.name) <= 8  # ranks 0..7 only
    for k in keys:
        assert r.delete(k) == 1
    leftover = [p for top in root.iterdir() if "_r" in top.name for p in top.rglob("*")]
    assert leftover == []
