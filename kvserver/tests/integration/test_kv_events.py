"""KV events from a real `strata-kv` process to real ZMQ SUB sockets (pyzmq): what a router's indexer would see.

Every scenario waits until the server reports each event it queued as handed to ZMQ, then reads exactly that many
from the subscriber, so no test depends on how fast anything runs.
"""

from __future__ import annotations

import threading
import urllib.request
from collections.abc import Iterator

import msgpack
import pytest
from strata_testsupport.kvevents import NAMESPACE, Subscriber, as_uint64, block_hash, block_key
from strata_testsupport.kvserver import KVServerFactory

pytestmark = pytest.mark.integration

EVENTS = {"events": {"publish": "tcp://127.0.0.1:*", "topic": "kv@node-a@{namespace}"}}


@pytest.fixture
def subscriber(kv_server_factory: KVServerFactory) -> Iterator[Subscriber]:
    sub = Subscriber(kv_server_factory(EVENTS))
    sub.join()
    yield sub
    sub.close()


def test_set_publishes_block_stored_with_the_hash_and_group(subscriber: Subscriber) -> None:
    subscriber.redis.set(block_key(1, group=0), b"a" * 1000)
    subscriber.redis.set(block_key(2, group=3), b"b" * 1000)
    events = subscriber.drain()
    assert [(e["type"], e["block_hashes"], e["group_idx"]) for e in events] == [
        ("BlockStored", [as_uint64(block_hash(1))], 0),
        ("BlockStored", [as_uint64(block_hash(2))], 3),
    ]
    assert all(e["medium"] == "STORAGE" and e["block_size"] == 0 and e["token_ids"] == [] for e in events)
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


def test_del_publishes_block_removed_and_other_keys_publish_nothing(subscriber: Subscriber) -> None:
    r = subscriber.redis
    r.set(block_key(5), b"x" * 100)
    r.set(b"plain-redis-key", b"x")
    r.set(b"model@1@0@abc123@bfloat16kv_bytes", b"x")  # LMCache's key format
    r.set(NAMESPACE + b"short-tail", b"x")  # in a namespace but no 8/16/32-byte hash + group
    r.delete(b"plain-redis-key", b"model@1@0@abc123@bfloat16kv_bytes", NAMESPACE + b"short-tail")
    r.delete(block_key(5))
    r.delete(block_key(6))  # never stored: nothing was removed
    events = subscriber.drain()
    assert [(e["type"], e["block_hashes"]) for e in events] == [
        ("BlockStored", [as_uint64(block_hash(5))]),
        ("BlockRemoved", [as_uint64(block_hash(5))]),
    ]


def test_l1_eviction_without_l2_is_a_removal(kv_server_factory: KVServerFactory) -> None:
    sub = Subscriber(kv_server_factory({**EVENTS, "l1": {"size": "256KiB"}}, l2_fs=False))
    sub.join()
    keys = [block_key(i) for i in range(20)]  # 20 x 64 KiB through a 256 KiB L1
    for key in keys:
        sub.redis.set(key, b"v" * 64 * 1024)
    sub.settled_stats()
    events = sub.drain()
    stored = [e["block_hashes"][0] for e in events if e["type"] == "BlockStored"]
    removed = {e["block_hashes"][0] for e in events if e["type"] == "BlockRemoved"}
    assert stored == [as_uint64(block_hash(i)) for i in range(20)]
    held = {as_uint64(block_hash(i)) for i, key in enumerate(keys) if sub.redis.exists(key)}
    assert removed and held
    assert removed == set(stored) - held  # exactly what is gone, nothing still held
    sub.close()


def test_moving_to_l2_is_not_a_removal_and_l2_eviction_of_the_last_copy_is(kv_server_factory: KVServerFactory) -> None:
    config = {
        **EVENTS,
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
    removed = [e["block_hashes"][0] for e in events if e["type"] == "BlockRemoved"]
    assert all(e["group_idx"] == 1 for e in events)
    still_held = {as_uint64(block_hash(i)) for i, key in enumerate(keys) if sub.redis.exists(key)}
    gone = {as_uint64(block_hash(i)) for i in range(40)} - still_held
    assert gone and still_held
    assert sorted(removed) == sorted(gone)  # once each, and never for a block that only moved
    sub.close()


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
