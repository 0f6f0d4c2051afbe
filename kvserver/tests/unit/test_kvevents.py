"""Which keys are vLLM blocks, how their hashes are published, and the bounded event queue."""

from __future__ import annotations

import pytest
from strata_kv.config import EventsConfig, KVServerConfig
from strata_kv.kvevents import EventPublisher, external_hash, parse_block_key

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
        publisher.stored(NS + bytes([i]) * 32 + b"\0\0\0\0")
    publisher.stored(b"not a block")
    stats = publisher.stats()
    assert (stats["events_queued"], stats["events_dropped"], stats["events_queue_depth"]) == (3, 2, 3)


def test_events_are_off_unless_an_endpoint_is_given() -> None:
    cfg = KVServerConfig()
    assert cfg.events.publish is None
    with pytest.raises(ValueError, match=r"events\.publish"):
        EventPublisher(cfg.events)
    with pytest.raises(ValueError, match="medium"):
        KVServerConfig.model_validate({"events": {"publish": "tcp://*:5557", "medium": "GPU"}})
