"""KV events from a real `strata-kv` process to real ZMQ SUB sockets (pyzmq): what a router's indexer would see.

Every scenario waits until the server reports each event it queued as handed to ZMQ, then reads exactly that many
from the subscriber, so no test depends on how fast anything runs.
"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator

import msgpack
import pytest
import redis
from strata_testsupport.kvevents import (
    NAMESPACE,
    MediumIndex,
    Subscriber,
    as_uint64,
    block_hash,
    block_key,
    listed_blocks,
)
from strata_testsupport.kvserver import KVServerFactory

pytestmark = pytest.mark.integration

EVENTS = {"events": {"publish": "tcp://127.0.0.1:*", "topic": "kv@node-a@{namespace}"}}


@pytest.fixture
def subscriber(kv_server_factory: KVServerFactory) -> Iterator[Subscriber]:
    sub = Subscriber(kv_server_factory(EVENTS))
    sub.join()
    yield sub
    sub.close()


def test_set_publishes_block_stored_for_l1_then_for_l2_once_written(subscriber: Subscriber) -> None:
    """A SET lands in L1 (medium CPU) at once and in L2 (medium STORAGE) when write-behind has written it."""
    subscriber.redis.set(block_key(1, group=0), b"a" * 1000)
    subscriber.redis.set(block_key(2, group=3), b"b" * 1000)
    events = subscriber.drain()
    expected = [([as_uint64(block_hash(1))], 0), ([as_uint64(block_hash(2))], 3)]
    assert [(e["block_hashes"], e["group_idx"]) for e in events if e["medium"] == "CPU"] == expected
    storage = sorted((e["block_hashes"], e["group_idx"]) for e in events if e["medium"] == "STORAGE")
    assert storage == sorted(expected)  # write-behind workers write in parallel
    assert len(events) == 4 and all(e["type"] == "BlockStored" for e in events)
    assert all(e["block_size"] == 0 and e["token_ids"] == [] and e["locality"] == "LOCAL" for e in events)
    topic, seq, payload = subscriber.raw[0]
    assert topic == b"kv@node-a@Qwen_Qwen3-0.6B_0123456789ab_r0"
    assert len(seq) == 8
    ts, _events, dp_rank = msgpack.unpackb(payload)
    assert isinstance(ts, float) and dp_rank is None
    stats = subscriber.settled_stats()
    with urllib.request.urlopen(f"{subscriber.server.metrics_url}/metrics", timeout=10) as response:
        metrics = response.read().decode()
    assert f"strata_kv_events_published_total {float(stats['events_published'])}" in metrics
    assert "strata_kv_events_dropped_total 0.0" in metrics


def test_del_publishes_block_removed_for_each_medium_and_other_keys_publish_nothing(subscriber: Subscriber) -> None:
    r = subscriber.redis
    r.set(block_key(5), b"x" * 100)
    r.set(b"plain-redis-key", b"x")
    r.set(b"model@1@0@abc123@bfloat16kv_bytes", b"x")  # LMCache's key format
    r.set(NAMESPACE + b"short-tail", b"x")  # in a namespace but no 8/16/32-byte hash + group
    subscriber.settled_stats()  # written to L2 before the DEL
    r.delete(b"plain-redis-key", b"model@1@0@abc123@bfloat16kv_bytes", NAMESPACE + b"short-tail")
    r.delete(block_key(5))
    r.delete(block_key(6))  # never stored: nothing was removed
    events = subscriber.drain()
    h = [as_uint64(block_hash(5))]
    assert [(e["type"], e["medium"], e["block_hashes"]) for e in events] == [
        ("BlockStored", "CPU", h),
        ("BlockStored", "STORAGE", h),
        ("BlockRemoved", "CPU", h),
        ("BlockRemoved", "STORAGE", h),
    ]


def test_l1_eviction_without_l2_is_a_removal(kv_server_factory: KVServerFactory) -> None:
    sub = Subscriber(kv_server_factory({**EVENTS, "l1": {"size": "256KiB"}}, l2_fs=False))
    sub.join()
    keys = [block_key(i) for i in range(20)]  # 20 x 64 KiB through a 256 KiB L1
    for key in keys:
        sub.redis.set(key, b"v" * 64 * 1024)
    events = sub.drain()
    assert {e["medium"] for e in events} == {"CPU"}
    stored = [e["block_hashes"][0] for e in events if e["type"] == "BlockStored"]
    removed = [h for e in events if e["type"] == "BlockRemoved" for h in e["block_hashes"]]
    assert stored == [as_uint64(block_hash(i)) for i in range(20)]
    held = {as_uint64(block_hash(i)) for i, key in enumerate(keys) if sub.redis.exists(key)}
    assert removed and held
    assert sorted(removed) == sorted(set(stored) - held)  # exactly what is gone, once each, nothing still held
    sub.close()


def test_one_medium_for_every_tier_keeps_a_block_until_no_tier_has_it(kv_server_factory: KVServerFactory) -> None:
    """`medium: STORAGE` (the view before per-tier media): moving from L1 to L2 is no removal; the L2 eviction of
    the last copy is."""
    config = {
        "events": {**EVENTS["events"], "medium": "STORAGE"},
        "l1": {"size": "256KiB"},
        "l2": {"fs": {"capacity": "1MiB", "high_watermark": 0.9, "low_watermark": 0.5}},
    }
    sub = Subscriber(kv_server_factory(config))
    sub.join()
    keys = [block_key(i, group=1) for i in range(40)]  # 40 x 64 KiB: through L1 into L2, and out of L2
    for key in keys:
        sub.redis.set(key, b"v" * 64 * 1024)
    stats = sub.settled_stats()
    assert stats["l1_evictions"] > 0 and stats["fs_evictions"] > 0
    events = sub.drain()
    assert {e["medium"] for e in events} == {"STORAGE"} and all(e["group_idx"] == 1 for e in events)
    index = MediumIndex().apply(sub.raw)
    still_held = {as_uint64(block_hash(i)) for i, key in enumerate(keys) if sub.redis.exists(key)}
    assert still_held and len(still_held) < 40
    assert {h for _ns, h, _g in index.held("STORAGE")} == still_held
    sub.close()


def test_a_routers_per_medium_index_matches_what_each_tier_holds(kv_server_factory: KVServerFactory) -> None:
    """A subscriber's index, built from the stream alone, equals the server's own listing of L1 (CPU) and of the
    L2 directory (STORAGE) after a run that evicts from L1, evicts from L2 at its watermark, promotes L2 hits back
    into L1, overwrites and DELs (some blocks in both tiers, some in L2 only)."""
    config = {
        **EVENTS,
        "l1": {"size": "384KiB", "eviction_policy": "lru"},
        "l2": {"fs": {"capacity": "2MiB", "high_watermark": 0.9, "low_watermark": 0.6, "rescan_interval_seconds": 0}},
    }
    sub = Subscriber(kv_server_factory(config))
    sub.join()
    r = sub.redis
    value = b"v" * 48 * 1024
    for i in range(80):  # 80 x 48 KiB: through an L1 of ~7 blocks and an L2 of ~38
        r.set(block_key(i, group=i % 2), value)
        if i % 10 == 9:
            sub.settled_stats()  # let write-behind keep up, so L2 sweeps happen between SETs too
    sub.settled_stats()
    for i in range(60, 70):  # L2 hits: promoted back into L1, evicting other L1 blocks
        assert r.get(block_key(i, group=i % 2)) == value
    r.delete(*[block_key(i, group=i % 2) for i in (61, 75, 79, 3)])  # L1 and L2, L2 only, L1 and L2, gone
    for i in (62, 77):
        r.set(block_key(i, group=i % 2), b"w" * 48 * 1024)  # overwrite
    stats = sub.settled_stats()
    assert stats["l1_evictions"] > 0 and stats["fs_evictions"] > 0 and stats["promotions"] >= 10
    sub.drain()
    assert not sub.gaps, f"messages lost (expected seq, got seq): {sub.gaps}; the index cannot be compared"
    assert sub.settled_stats()["events_dropped"] == 0
    index = MediumIndex().apply(sub.raw)
    l1, fs = listed_blocks(sub.server, "l1"), listed_blocks(sub.server, "fs")
    assert l1 and fs and l1 & fs and fs - l1  # both tiers hold blocks, some in both, some in L2 only
    assert index.held("CPU") == l1
    assert index.held("STORAGE") == fs
    assert set(index.media) <= {"CPU", "STORAGE"}
    sub.close()


def test_dropping_a_namespaces_blocks_publishes_their_removal_in_few_messages(
    kv_server_factory: KVServerFactory,
) -> None:
    """Many blocks of one namespace removed through the store's removal path (DEL, which namespace cleanup uses):
    a BlockRemoved for each medium that held each block, many hashes to an event; another namespace is untouched."""
    sub = Subscriber(kv_server_factory(EVENTS))
    sub.join()
    other = b"meta-llama_Llama-3.1-8B_fedcba987654_r0/"
    pipe = sub.redis.pipeline(transaction=False)
    for i in range(300):
        pipe.set(block_key(i), b"x" * 512)
    pipe.set(other + block_hash(0) + b"\0\0\0\0", b"y")
    assert all(pipe.execute())
    sub.drain()
    assert sub.redis.delete(*[block_key(i) for i in range(300)]) == 300
    events = sub.drain()
    assert {(e["type"], e["medium"]) for e in events} == {("BlockRemoved", "CPU"), ("BlockRemoved", "STORAGE")}
    for medium in ("CPU", "STORAGE"):
        hashes = [h for e in events if e["medium"] == medium for h in e["block_hashes"]]
        assert sorted(hashes) == sorted(as_uint64(block_hash(i)) for i in range(300))
    assert len(events) < 600  # runs of removals merged (how many depends on how far the publisher thread lags)
    index = MediumIndex().apply(sub.raw)
    assert index.held("CPU") == listed_blocks(sub.server, "l1") == {(other[:-1].decode(), as_uint64(block_hash(0)), 0)}
    assert index.held("STORAGE") == listed_blocks(sub.server, "fs") == index.held("CPU")
    sub.close()


def test_a_restart_clears_what_was_announced_and_announces_what_l2_still_holds(
    kv_server_factory: KVServerFactory,
) -> None:
    """What a previous process held in DRAM is gone after a restart: AllBlocksCleared, then a BlockStored (STORAGE)
    for each block the L2 directory still holds, so a router's view starts over from what the server has. (The burst
    goes out before any subscriber can have joined the new process, so the server's counters tell what it sent.)"""
    server = kv_server_factory(EVENTS)
    r = server.redis()
    for i in range(12):
        r.set(block_key(i), b"v" * 4096)
    r.delete(block_key(0))
    r.close()
    server.restart()
    client = server.client()
    while (stats := client.stats())["events_announcing"] or stats["events_pending"]:
        time.sleep(0.02)
    client.close()
    assert listed_blocks(server, "l1") == set()
    held = listed_blocks(server, "fs")
    assert held == {("Qwen_Qwen3-0.6B_0123456789ab_r0", as_uint64(block_hash(i)), 0) for i in range(1, 12)}
    assert stats["events_announced"] == len(held)
    assert stats["events_published"] == 1 + len(held) and stats["events_dropped"] == 0  # AllBlocksCleared first


def test_the_listing_names_its_tiers(kv_server_factory: KVServerFactory) -> None:
    r = kv_server_factory(l2_fs=False).redis()
    assert r.execute_command("STRATA.BLOCKS", "l1") == []
    with pytest.raises(redis.ResponseError, match=r"no tier 'fs' on this server \(it has l1\)"):
        r.execute_command("STRATA.BLOCKS", "fs")
    r.close()


def test_a_stalled_subscriber_neither_blocks_sets_nor_starves_a_live_one(kv_server_factory: KVServerFactory) -> None:
    server = kv_server_factory({"events": {"publish": "tcp://127.0.0.1:*", "batch_max": 8}}, l2_fs=False)
    live = Subscriber(server)
    live.join()
    stalled = Subscriber(server, rcvhwm=1)  # connected and subscribed (join proves it), then never read again
    stalled.join()
    received: list[int] = []
    end = as_uint64(b"\xdd" * 32)

    def read() -> None:  # the live subscriber reads on its own thread, as a router's would, up to the end mark
        while True:
            frames = live.socket.recv_multipart()
            for event in msgpack.unpackb(frames[2])[1]:
                if event["block_hashes"] == [end]:
                    return
                if event["type"] == "BlockStored" and event["group_idx"] == 2:
                    received.append(event["block_hashes"][0])

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    pipe = live.redis.pipeline(transaction=False)
    for i in range(3000):
        pipe.set(block_key(i, group=2), b"s")
    assert all(pipe.execute())  # every SET answered while one subscriber reads nothing
    live.redis.set(NAMESPACE + b"\xdd" * 32 + b"\0\0\0\0", b"end")
    stats = live.settled_stats()
    assert stats["events_dropped"] == 0
    reader.join()
    assert sorted(received) == sorted(as_uint64(block_hash(i)) for i in range(3000))
    stalled.close()
    live.close()


def test_a_full_event_queue_drops_and_counts_and_never_holds_a_set(kv_server_factory: KVServerFactory) -> None:
    """A one-event queue: whatever the publisher thread does not take at once is dropped, every event counted."""
    server = kv_server_factory({"events": {"publish": "tcp://127.0.0.1:*", "queue_max": 1}}, l2_fs=False)
    client = server.client()
    before = client.stats()
    pipe = server.redis().pipeline(transaction=False)
    for i in range(3000):
        pipe.set(block_key(i), b"s")
    assert all(pipe.execute())
    after = client.stats()
    accounted = (after["events_queued"] + after["events_dropped"]) - (
        before["events_queued"] + before["events_dropped"]
    )
    assert accounted == 3000
    assert after["events_queue_depth"] <= 1
    client.close()


def test_events_are_off_by_default(kv_server_factory: KVServerFactory) -> None:
    server = kv_server_factory(l2_fs=False)
    r = server.redis()
    assert r.config_get("strata.events-endpoint")["strata.events-endpoint"] == ""
    assert "events_queued" not in server.client().stats()
    r.close()


def test_an_endpoint_that_cannot_bind_stops_the_start_naming_the_setting(kv_server_factory: KVServerFactory) -> None:
    with pytest.raises(RuntimeError, match=r"events\.publish"):
        kv_server_factory({"events": {"publish": "bogus://nowhere"}}, l2_fs=False)
