"""A real ZMQ SUB subscriber (pyzmq) on a `strata-kv` server's KV event endpoint, as a router's indexer would be.

Used by the kvserver event tests and the vLLM decoder test. It never guesses at timing: `join` SETs a probe block
until its event arrives (ZMQ's slow joiner), and `drain` ends at a marker block's removal, which the server
publishes after everything before it.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

import msgpack
import zmq

from strata_testsupport.kvserver import KVServerProcess

NAMESPACE = b"Qwen_Qwen3-0.6B_0123456789ab_r0/"
"""What `strata_kv.vllm_tier.namespace_prefix` gives for a model `Qwen/Qwen3-0.6B` (digest made up)."""


def block_hash(i: int) -> bytes:
    return hashlib.sha256(f"block{i}".encode()).digest()


def block_key(i: int, group: int = 0) -> bytes:
    """A vLLM-tier key: namespace, then vLLM's offload key (block hash + 4-byte big-endian group)."""
    return NAMESPACE + block_hash(i) + group.to_bytes(4, "big")


def as_uint64(h: bytes) -> int:
    return int.from_bytes(h, "big") & (2**64 - 1)


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
        """Every event published so far (frames kept in `raw`): reads until a marker block's removal arrives."""
        marker = marker_namespace + b"\xee" * 32 + b"\0\0\0\0"
        self.redis.delete(marker)  # not held: no event; SET then DEL gives a Stored and a Removed at the end
        self.redis.set(marker, b"m")
        self.redis.delete(marker)
        events: list[dict[str, Any]] = []
        while True:
            frames = self.socket.recv_multipart()
            self.raw.append(frames)
            batch = msgpack.unpackb(frames[2])
            for event in batch[1]:
                if event.get("block_hashes") == [as_uint64(b"\xee" * 32)]:
                    if event["type"] == "BlockRemoved":
                        return events
                    continue
                events.append(event)

    def close(self) -> None:
        self.socket.close(linger=0)
        self.redis.close()
