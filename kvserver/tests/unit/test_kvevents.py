"""Which keys are vLLM blocks, how their hashes are published, and the bounded event queue."""

from __future__ import annotations

from typing import Any

import pytest
from strata_kv.config import EventMedia, EventsConfig, KVServerConfig
from strata_kv.store.blockfile import locate, vllm_tier_key_of
from strata_kv.store.kvevents import EventPublisher, external_hash, merge_removals, parse_block_key

NS = b"meta-llama_Llama-3.1-8B_0123456789ab_r0/"


@pytest.mark.parametrize("size", [8, 16, 32])
def test_a_vllm_tier_key_names_its_hash_and_group(size: int) -> None:
    h = bytes(range(size))
    block = parse_block_key(NS + h + (7).to_bytes(4, "big"))
    assert block is not None
    assert (block.namespace, block.block_hash, block.group) == ("meta-llama_Llama-3.1-8B_0123456789ab_r0", h, 7)


@pytest.mark.parametrize(
    "key",
    [
        b"model@1@0@abc123@bfloat16kv_bytes",  # LMCache
        b"plain",
        bytes(range(36)),  # a bare offload key without the tier's namespace
        NS + bytes(range(22)),  # 18 bytes of hash: no vLLM hash has that size
        b"m_0123456789ab_r0/" + bytes(range(31)),
        b"m_0123456789AB_r0/" + bytes(range(36)),  # the digest is lower-case hex
        b"m_0123456789ab_r01/" + bytes(range(36)),  # no leading zeros in the rank
        b"m_0123456789ab/" + bytes(range(36)),
    ],
)
def test_other_keys_are_not_blocks(key: bytes) -> None:
    assert parse_block_key(key) is None


def test_hashes_are_published_like_vllm_does() -> None:
    h = bytes(range(1, 33))
    assert external_hash(h, True) == int.from_bytes(h[-8:], "big")
    assert external_hash(h, False) == h


def test_a_full_queue_drops_and_counts_instead_of_growing() -> None:
    """The queue alone, before a socket exists: producers never wait, past queue_max they drop."""
    publisher = EventPublisher(EventsConfig(publish="tcp://127.0.0.1:*", queue_max=3))
    for i in range(5):
        publisher.stored(NS + bytes([i]) * 32 + b"\0\0\0\0", "CPU")
    publisher.stored(b"not a block", "CPU")
    stats = publisher.stats()
    assert (stats["events_queued"], stats["events_dropped"], stats["events_queue_depth"]) == (3, 2, 3)


def test_events_are_off_unless_an_endpoint_is_given() -> None:
    cfg = KVServerConfig()
    assert cfg.events.publish is None
    with pytest.raises(ValueError, match=r"events\.publish"):
        EventPublisher(cfg.events)
    with pytest.raises(ValueError, match="medium"):
        KVServerConfig.model_validate({"events": {"publish": "tcp://*:5557", "medium": "GPU"}})


def test_each_tier_names_its_own_medium_unless_one_is_given_for_all() -> None:
    """Default: the DRAM L1 is vLLM's CPU medium, the L2 tiers its STORAGE medium. One value, the only form before
    per-tier media, still means one medium for every tier; a medium vLLM would not report for a tier is refused."""
    assert EventsConfig().medium == EventMedia(l1="CPU", l2="STORAGE")
    media = EventsConfig.model_validate({"medium": "STORAGE"}).medium
    assert (media.of("l1"), media.of("fs"), media.of("s3")) == ("STORAGE", "STORAGE", "STORAGE")
    media = EventsConfig.model_validate({"medium": {"l2": "CPU"}}).medium
    assert (media.of("l1"), media.of("fs")) == ("CPU", "CPU")
    with pytest.raises(ValueError, match="medium"):
        EventsConfig.model_validate({"medium": {"l1": "GPU"}})
    one = KVServerConfig.model_validate({"events": {"medium": "STORAGE"}})
    written = KVServerConfig.from_yaml(one.to_yaml())
    assert written.events.medium == EventMedia(l1="STORAGE", l2="STORAGE")


@pytest.mark.parametrize("size", [8, 16, 32])
def test_a_block_file_path_names_the_key_it_holds(size: int) -> None:
    """Eviction works on paths: the vLLM-tier key comes back from vLLM's layout without reading the file."""
    key = NS.replace(b"_r0/", b"_r3/") + bytes(range(7, 7 + size)) + (5).to_bytes(4, "big")
    assert vllm_tier_key_of(locate(key).relpath("unused")) == key
    assert vllm_tier_key_of(locate(b"model@1@0@abc123@bfloat16kv_bytes").relpath(NS[:-4].decode())) is None
    assert vllm_tier_key_of(locate(b"plain").relpath(NS[:-4].decode())) is None


def removed(h: int, medium: str = "CPU", group: int = 0) -> dict[str, Any]:
    return {"type": "BlockRemoved", "block_hashes": [h], "medium": medium, "group_idx": group}


def stored(h: int, medium: str = "CPU", group: int = 0) -> dict[str, Any]:
    return {"type": "BlockStored", "block_hashes": [h], "medium": medium, "group_idx": group}


def test_removals_become_one_event_per_medium_and_group_where_the_order_allows() -> None:
    """DEL of many blocks held in L1 and L2 alternates CPU and STORAGE removals, a watermark sweep in one thread
    interleaves with other threads' writes: one BlockRemoved per medium and group. A removal never moves ahead of a
    store of the same block in its medium (the subscriber would keep a block the server dropped), nor of an
    AllBlocksCleared; the queued events themselves are not changed."""
    events = [removed(1), removed(1, "STORAGE"), removed(2), removed(2, "STORAGE"), removed(3, group=1)]
    events += [stored(4), removed(5), stored(6, "STORAGE"), removed(6, "STORAGE"), removed(7, "STORAGE")]
    events += [{"type": "AllBlocksCleared"}, removed(8), removed(9)]
    merged = merge_removals(events)
    assert [(e["type"], e.get("medium"), e.get("group_idx"), e.get("block_hashes")) for e in merged] == [
        ("BlockRemoved", "CPU", 0, [1, 2, 5]),
        ("BlockRemoved", "STORAGE", 0, [1, 2]),
        ("BlockRemoved", "CPU", 1, [3]),
        ("BlockStored", "CPU", 0, [4]),
        ("BlockStored", "STORAGE", 0, [6]),
        ("BlockRemoved", "STORAGE", 0, [6, 7]),
        ("AllBlocksCleared", None, None, None),
        ("BlockRemoved", "CPU", 0, [8, 9]),
    ]
    assert [e["block_hashes"] for e in events[:2]] == [[1], [1]]


def test_a_backlog_of_removals_goes_out_as_few_messages() -> None:
    """What the publishing thread finds queued (a namespace's 600 removals from L1 and L2, alternating) goes out as
    batch_max events to a message, each message one BlockRemoved per medium."""
    publisher = EventPublisher(EventsConfig(publish="tcp://127.0.0.1:*"))
    for i in range(300):
        key = NS + i.to_bytes(32, "big") + b"\0\0\0\0"
        publisher.removed(key, "CPU")
        publisher.removed(key, "STORAGE")
    messages = []
    while (message := publisher._take()) is not None:
        messages.append(message)
    assert [(len(events), taken) for _topic, events, taken in messages] == [(2, 256), (2, 256), (2, 88)]
    hashes = [h for _t, events, _n in messages for e in events if e["medium"] == "CPU" for h in e["block_hashes"]]
    assert hashes == [external_hash(i.to_bytes(32, "big"), True) for i in range(300)]
