"""KV events for the blocks the server holds, in vLLM 0.33's own wire format (`vllm/distributed/kv_events.py`).

A prefix-aware router (llm-d's indexer) learns which GPU and CPU blocks each vLLM instance holds from that
instance's event stream, but nothing tells it which node's storage tier holds a block (llm-d-kv-cache #520), nor
that a tier dropped one. The server publishes, per node, the same stream for what each of its tiers holds: ZMQ PUB
messages of three frames `(topic, 8-byte big-endian sequence number, msgpack KVEventBatch)`, where a
`KVEventBatch` is the array `[ts, events, data_parallel_rank]` and each event a map tagged `"type"`.

One medium per tier (`events.medium`, vLLM's vocabulary): `CPU` for the DRAM L1 and `STORAGE` for the L2 tiers by
default, as vLLM's own offloading names its CPU tier and its `fs`/`obj` tiers; llm-d's indexer keeps an entry per
(pod, medium). A block in L1 and L2 is held in two media, and each tier's changes are events for its medium:

- `BlockStored` when L1 takes a block (a SET, a promotion from L2) or an L2 write of it finishes;
- `BlockRemoved` when a tier lets it go (L1 eviction, L2 watermark eviction, DEL, a corrupt file) and no other tier
  of the same medium holds it (fs and S3 share `STORAGE`; `medium: STORAGE` for every tier gives the view before
  per-tier media, where a move between L1 and L2 is no event). The store decides; see `TieredStore._tier_dropped`;
- `AllBlocksCleared` when the server starts (what a previous process announced is void); the store then announces
  what its L2 index holds.

Which keys are blocks: the vLLM tier's keys, `<model>_<digest12>_r<rank>/` + vLLM's offload key (the chunk's last
block hash, 8, 16 or 32 bytes, then a 4-byte big-endian KV-group index); see `strata_kv.vllm.tier`. LMCache keys
and other RESP keys carry no vLLM block hash and produce no events.

Fields: `block_hashes` are uint64 (vLLM's default, `VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1`: the big-endian hash's
low 64 bits) or the hash bytes; `group_idx` is the KV group; `locality` is LOCAL (the publisher's own storage).
Like vLLM's own events for an offloaded block whose tokens it did not see (its "placeholder" BlockStored),
`token_ids` is empty, `parent_block_hash` null and `block_size` 0: the server stores chunks, never tokens.

Never in the way: producers only append to a bounded queue (past `queue_max` an event is dropped and counted); one
thread waits `LINGER_SECONDS` once woken, then encodes and sends up to `batch_max` queued events of a topic to a
message, the removals of one medium and group in it merged into one BlockRemoved where the order allows
(`merge_removals`), so a watermark sweep or a namespace's removal is a few messages. ZMQ itself drops messages for
a subscriber past its high-water mark; the subscriber sees the gap in the sequence numbers. No replay socket.

pyzmq and msgpack are imported only when events are on (`strata[runtime]` carries them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

from ..config import EventsConfig
from .blockfile import split_vllm_tier_key

log = logging.getLogger(__name__)

BLOCK_HASH_SIZES = (8, 16, 32)
"""vLLM's block hash sizes (xxhash 64/128 bits, sha256)."""
GROUP_BYTES = 4
LINGER_SECONDS = 0.002
"""How long the publishing thread waits, once woken, for more events to share the message: a burst of events
(an L2 watermark sweep, a namespace's removal, a pipeline of SETs) goes out in a few messages rather than one per
event, at 2 ms of added latency (vLLM publishes once per scheduler step, tens of milliseconds)."""


@dataclass(frozen=True)
class BlockKey:
    """A vLLM-tier key read back: which namespace, block hash and KV group it stores."""

    namespace: str
    block_hash: bytes
    group: int


def parse_block_key(key: bytes) -> BlockKey | None:
    """The block a vLLM-tier key names, or None for any other key (LMCache's, arbitrary RESP keys)."""
    tier_key = split_vllm_tier_key(key)  # `<model>_<digest12>_r<rank>/`: what vllm_tier.namespace_prefix builds
    if tier_key is None:
        return None
    namespace, rank, rest = tier_key
    if len(rest) - GROUP_BYTES not in BLOCK_HASH_SIZES:
        return None
    return BlockKey(f"{namespace}_r{rank}", rest[:-GROUP_BYTES], int.from_bytes(rest[-GROUP_BYTES:], "big"))


def external_hash(block_hash: bytes, as_int: bool) -> int | bytes:
    """The hash as vLLM publishes it (`maybe_convert_block_hash`)."""
    if as_int:
        return int.from_bytes(block_hash, "big") & 0xFFFF_FFFF_FFFF_FFFF
    return block_hash


def merge_removals(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One BlockRemoved with many hashes where the order allows it, as vLLM's offloading publishes an eviction: a
    removal joins the earlier removal of its medium and KV group unless a store of one of its blocks (same medium and
    group) came in between; then it starts a new one. Moving a removal ahead of other events changes no block's
    final state: the blocks it names are stored in that medium nowhere between. AllBlocksCleared ends every run.
    The events given are not changed."""
    out: list[dict[str, Any]] = []
    runs: dict[tuple[Any, Any], tuple[dict[str, Any], set[Any]]] = {}  # (medium, group) -> (removal, stored since)
    for event in events:
        if event["type"] == "AllBlocksCleared":
            runs.clear()
            out.append(event)
            continue
        slot = (event["medium"], event["group_idx"])
        run = runs.get(slot)
        if event["type"] == "BlockStored":
            if run is not None:
                run[1].update(event["block_hashes"])
            out.append(event)
            continue
        if run is not None and run[1].isdisjoint(event["block_hashes"]):
            run[0]["block_hashes"].extend(event["block_hashes"])
            continue
        removal = {**event, "block_hashes": list(event["block_hashes"])}  # later removals extend this copy
        runs[slot] = (removal, set())
        out.append(removal)
    return out


class EventPublisher:
    """The bounded event queue and the thread that publishes it. Thread-safe: `stored`/`removed`/`cleared`
    may be called from the event loop and from L2 threads; none of them waits on ZMQ."""

    def __init__(self, cfg: EventsConfig) -> None:
        if not cfg.publish:
            raise ValueError("events.publish is not set: nothing to publish on")
        self.cfg = cfg
        self._queue: deque[tuple[bytes, dict[str, Any]]] = deque()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._seq = 0
        self.counts: Counter[str] = Counter()
        self.endpoint = ""
        """Where the PUB socket is bound (a `tcp://*:0` endpoint resolved to its port)."""
        self._socket: Any = None
        self._context: Any = None

    # -- producers (any thread, never blocking) -------------------------------------------------------
    def _topic(self, namespace: str) -> bytes:
        return self.cfg.topic.replace("{namespace}", namespace).encode()

    def _put(self, topic: bytes, event: dict[str, Any]) -> None:
        with self._lock:
            if len(self._queue) >= self.cfg.queue_max:
                self.counts["dropped"] += 1
                return
            self._queue.append((topic, event))
            self.counts["queued"] += 1
        self._wake.set()

    def stored(self, key: bytes, medium: str) -> None:
        """A tier of `medium` holds the block `key` names (again); nothing for keys that name no block."""
        block = parse_block_key(key)
        if block is None:
            return
        self._put(
            self._topic(block.namespace),
            {
                "type": "BlockStored",
                "block_hashes": [external_hash(block.block_hash, self.cfg.int_block_hashes)],
                "parent_block_hash": None,
                "token_ids": [],
                "block_size": self.cfg.block_size,
                "lora_id": None,
                "medium": medium,
                "lora_name": None,
                "group_idx": block.group,
                "locality": "LOCAL",
            },
        )

    def removed(self, key: bytes, medium: str) -> None:
        """No tier of `medium` holds the block `key` names any more."""
        block = parse_block_key(key)
        if block is None:
            return
        self._put(
            self._topic(block.namespace),
            {
                "type": "BlockRemoved",
                "block_hashes": [external_hash(block.block_hash, self.cfg.int_block_hashes)],
                "medium": medium,
                "group_idx": block.group,
                "locality": "LOCAL",
            },
        )

    def cleared(self) -> None:
        """Everything is gone (a start without L2). Sent on the topic with `{namespace}` left empty."""
        self._put(self._topic(""), {"type": "AllBlocksCleared"})

    # -- the publishing thread ------------------------------------------------------------------------
    def start(self) -> None:
        """Bind the PUB socket (a bad endpoint fails the start, naming the setting) and start the thread."""
        import msgpack
        import zmq

        self._packer = msgpack.Packer(use_bin_type=True)
        self._context = zmq.Context.instance()
        sock = self._context.socket(zmq.PUB)
        sock.setsockopt(zmq.SNDHWM, self.cfg.send_hwm)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.bind(self.cfg.publish)
        except zmq.ZMQError as e:
            sock.close()
            raise ValueError(f"events.publish {self.cfg.publish!r}: cannot bind: {e}") from None
        self._socket = sock
        self.endpoint = sock.getsockopt(zmq.LAST_ENDPOINT).decode()
        self._thread = threading.Thread(target=self._run, name="strata-kv-events", daemon=True)
        self._thread.start()
        log.info("KV events published on %s", self.endpoint)

    def _take(self) -> tuple[bytes, list[dict[str, Any]], int] | None:
        """The next message: up to batch_max queued events that share a topic, removals merged (`merge_removals`),
        as (topic, events, how many queued events it carries)."""
        with self._lock:
            if not self._queue:
                return None
            topic, first = self._queue.popleft()
            taken = [first]
            while self._queue and len(taken) < self.cfg.batch_max and self._queue[0][0] == topic:
                taken.append(self._queue.popleft()[1])
        return topic, merge_removals(taken), len(taken)

    def _run(self) -> None:
        import zmq

        while True:
            if self._wake.wait(0.5) and not self._stop.is_set():
                time.sleep(LINGER_SECONDS)  # let a burst (a sweep, a namespace's removal) gather into few messages
            self._wake.clear()
            while (batch := self._take()) is not None:
                topic, events, taken = batch
                payload = self._packer.pack([time.time(), events, None])
                seq = self._seq
                self._seq += 1
                try:
                    self._socket.send_multipart((topic, seq.to_bytes(8, "big"), payload), flags=zmq.NOBLOCK)
                except zmq.ZMQError as e:  # PUB drops rather than blocks (zmq.Again only on other transports)
                    if not isinstance(e, zmq.Again):
                        log.warning("KV event send failed: %s", e)
                    with self._lock:
                        self.counts["send_failed"] += taken
                    continue
                with self._lock:
                    self.counts["published"] += taken
                    self.counts["batches"] += 1
            if self._stop.is_set():
                return

    def close(self) -> None:
        """Send what is queued (the thread empties the queue before it looks at the stop flag), then close."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if self._socket is not None:
            self._socket.close()
            self._socket = None

    @property
    def depth(self) -> int:
        """Events queued, not yet taken by the publishing thread."""
        return len(self._queue)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {
                "events_queued": self.counts["queued"],
                "events_published": self.counts["published"],
                "events_batches": self.counts["batches"],
                "events_dropped": self.counts["dropped"] + self.counts["send_failed"],
                "events_queue_depth": len(self._queue),
                "events_pending": self.counts["queued"] - self.counts["published"] - self.counts["send_failed"],
            }
