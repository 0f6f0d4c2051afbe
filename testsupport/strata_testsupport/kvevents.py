"""A real ZMQ SUB subscriber (pyzmq) on a `strata-kv` server's KV event endpoint, as a router's indexer would be.

Used by the kvserver event tests and the vLLM decoder test. It never guesses at timing: `join` SETs a probe block
until its event arrives (ZMQ's slow joiner), and `drain` waits until the server has written every queued chunk to
L2 and sent every event, then reads up to a marker block's removal from each medium that stored it.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import msgpack
import zmq

from strata_testsupport.kvserver import KVServerProcess

NAMESPACE = b"Qwen_Qwen3-0.6B_0123456789ab_r0/"
"""What `strata_kv.vllm.tier.namespace_prefix` gives for a model `Qwen/Qwen3-0.6B` (digest made up)."""


def block_hash(i: int) -> bytes:
    return hashlib.sha256(f"block{i}".encode()).digest()


def block_key(i: int, group: int = 0) -> bytes:
    """A vLLM-tier key: namespace, then vLLM's offload key (block hash + 4-byte big-endian group)."""
    return NAMESPACE + block_hash(i) + group.to_bytes(4, "big")


def as_uint64(h: bytes) -> int:
    return int.from_bytes(h, "big") & (2**64 - 1)


MARKER_HASH = b"\xee" * 32
"""The block `Subscriber.drain` ends at (its events are left out of what it returns)."""


Block = tuple[str, int, int]
"""(namespace, published hash, KV group): one block in a medium, as a router's index keys it."""


class MediumIndex:
    """A router's view of one publisher, per medium: BlockStored adds, BlockRemoved removes, AllBlocksCleared
    clears every medium (as llm-d's indexer does). The namespace comes from the topic `kv@node-a@{namespace}`."""

    def __init__(self) -> None:
        self.media: dict[str, set[Block]] = {}

    def apply(self, frames: list[list[bytes]]) -> MediumIndex:
        for topic, _seq, payload in frames:
            namespace = topic.decode().rsplit("@", 1)[-1]
            for event in msgpack.unpackb(payload)[1]:
                if event["type"] == "AllBlocksCleared":
                    self.media.clear()
                    continue
                blocks = {(namespace, h, event["group_idx"]) for h in event["block_hashes"]}
                held = self.media.setdefault(event["medium"], set())
                if event["type"] == "BlockStored":
                    held |= blocks
                else:
                    held -= blocks
        return self

    def held(self, medium: str) -> set[Block]:
        return set(self.media.get(medium, ()))


def listed_blocks(server: KVServerProcess, tier: str) -> set[Block]:
    """What the server says `tier` holds (`STRATA.BLOCKS`), keyed as `MediumIndex` keys a block."""
    from strata_kv.store.kvevents import parse_block_key

    r = server.redis()
    try:
        keys = r.execute_command("STRATA.BLOCKS", tier)
    finally:
        r.close()
    blocks = set()
    for key in keys:
        block = parse_block_key(key)
        assert block is not None, f"STRATA.BLOCKS {tier} listed {key!r}, which names no block"
        blocks.add((block.namespace, as_uint64(block.block_hash), block.group))
    return blocks


class Subscriber:
    """A ZMQ SUB socket on the server's event endpoint, decoding the three frames vLLM's publisher sends."""

    def __init__(self, server: KVServerProcess, topic: bytes = b"", rcvhwm: int = 0) -> None:
        self.server = server
        self.redis = server.redis()
        self.endpoint = self.redis.config_get("strata.events-endpoint")["strata.events-endpoint"]
        self.socket = zmq.Context.instance().socket(zmq.SUB)
        self.socket.setsockopt(zmq.RCVHWM, rcvhwm)
        self.socket.setsockopt(zmq.SUBSCRIBE, topic)
        self.socket.connect(self.endpoint)
        self.raw: list[list[bytes]] = []
        self.next_seq: int | None = None
        self.gaps: list[tuple[int, int]] = []
        """(expected, received) sequence numbers where messages were lost (ZMQ's high-water mark)."""

    def join(self) -> None:
        """Wait out ZMQ's slow joiner: SET a probe block until its event arrives, then read everything queued."""
        probe = NAMESPACE + b"\xff" * 32 + b"\0\0\0\0"
        while True:
            self.redis.set(probe, b"probe")
            if self.socket.poll(200):
                break
        self.redis.delete(probe)
        self.drain()
        self.raw.clear()

    def settled_stats(self) -> dict[str, Any]:
        """The server's counters once every event it queued has been handed to ZMQ."""
        client = self.server.client()
        try:
            while True:
                stats = client.stats()
                if stats.get("write_behind_depth", 0) == 0 and stats["events_pending"] == 0:
                    return stats
                time.sleep(0.02)
        finally:
            client.close()

    def drain(self, marker_namespace: bytes = NAMESPACE) -> list[dict[str, Any]]:
        """Every event published so far (frames kept in `raw`), the marker's own left out.

        Settles first (L2 writes publish their medium's BlockStored when they finish), then SETs a marker block,
        settles again, DELs it and reads until each medium that announced the marker has removed it: the server
        publishes that after everything before it."""
        marker = marker_namespace + MARKER_HASH + b"\0\0\0\0"
        self.settled_stats()
        self.redis.set(marker, b"m")
        self.settled_stats()
        self.redis.delete(marker)
        events: list[dict[str, Any]] = []
        marker_media: set[str] = set()
        while True:
            frames = self.socket.recv_multipart()
            self.raw.append(frames)
            seq = int.from_bytes(frames[1], "big")
            if self.next_seq is not None and seq != self.next_seq:
                self.gaps.append((self.next_seq, seq))
            self.next_seq = seq + 1
            batch = msgpack.unpackb(frames[2])
            for event in batch[1]:
                hashes = event.get("block_hashes", [])
                if as_uint64(MARKER_HASH) in hashes:
                    if event["type"] == "BlockStored":
                        marker_media.add(event["medium"])
                    else:
                        marker_media.discard(event["medium"])
                        if not marker_media:
                            return events
                    event = {**event, "block_hashes": [h for h in hashes if h != as_uint64(MARKER_HASH)]}
                    if not event["block_hashes"]:
                        continue
                events.append(event)

    def close(self) -> None:
        self.socket.close(linger=0)
        self.redis.close()
