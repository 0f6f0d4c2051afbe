"""The store's removal API publishes KV events on its own: whatever removes keys through `TieredStore.delete_many`
(DEL does; so does dropping a namespace's blocks) needs to know nothing about events. In-process store, real L2
directory, real ZMQ SUB socket (pyzmq)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import zmq
from strata_kv.config import KVServerConfig
from strata_kv.store.tiered import TieredStore
from strata_testsupport.kvevents import MARKER_HASH, NAMESPACE, as_uint64, block_hash, block_key

pytestmark = pytest.mark.integration

OTHER = b"meta-llama_Llama-3.1-8B_fedcba987654_r0/"


class InProcess:
    """A started store and a SUB socket that has joined its stream."""

    def __init__(self, store: TieredStore, sock: Any) -> None:
        self.store, self.sock = store, sock
        self.frames: list[list[bytes]] = []

    async def settled(self) -> None:
        assert self.store.write_behind is not None and self.store.events is not None
        while self.store.write_behind.depth or self.store.events.stats()["events_pending"]:
            await asyncio.sleep(0.01)

    async def drain(self) -> list[dict[str, Any]]:
        """Every event so far, up to the marker block's removal from L2 (published after everything before it)."""
        marker = NAMESPACE + MARKER_HASH + b"\0\0\0\0"
        await self.settled()
        await self.store.set(marker, b"m")
        await self.settled()
        await self.store.delete(marker)
        events: list[dict[str, Any]] = []
        while True:
            while not self.sock.poll(0):
                await asyncio.sleep(0.01)
            frames = self.sock.recv_multipart()
            self.frames.append(frames)
            for event in msgpack.unpackb(frames[2])[1]:
                if event["type"] == "AllBlocksCleared":  # the start's, if the subscription was in time
                    continue
                hashes = [h for h in event["block_hashes"] if h != as_uint64(MARKER_HASH)]
                if hashes:
                    events.append({**event, "block_hashes": hashes})
                marker_gone = event["type"] == "BlockRemoved" and event["medium"] == "STORAGE"
                if marker_gone and len(hashes) < len(event["block_hashes"]):
                    return events


@pytest.fixture
async def in_process(tmp_path: Path) -> AsyncIterator[InProcess]:
    cfg = KVServerConfig.model_validate(
        {
            "events": {"publish": "tcp://127.0.0.1:*", "topic": "kv@node-a@{namespace}"},
            "l2": {"fs": {"root_dir": str(tmp_path / "l2"), "capacity": "1GiB", "rescan_interval_seconds": 0}},
        }
    )
    store = TieredStore(cfg)
    await store.start()
    assert store.events is not None
    sock = zmq.Context.instance().socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.connect(store.events.endpoint)
    probe = NAMESPACE + b"\xff" * 32 + b"\0\0\0\0"
    while not sock.poll(0):  # ZMQ's slow joiner: publish until the subscription has arrived
        await store.set(probe, b"p")
        await asyncio.sleep(0.05)
    await store.delete(probe)
    joined = InProcess(store, sock)
    await joined.drain()
    joined.frames.clear()
    yield joined
    sock.close(linger=0)
    await store.close()


async def test_removing_a_namespaces_blocks_through_the_store_publishes_each_medium(in_process: InProcess) -> None:
    store = in_process.store
    for i in range(200):
        await store.set(block_key(i), b"x" * 512)
    await store.set(OTHER + block_hash(0) + b"\0\0\0\0", b"y")
    await in_process.drain()
    first = len(in_process.frames)
    found = await store.delete_many([block_key(i) for i in range(150)] + [block_key(0), block_key(999)])
    assert found == [True] * 150 + [False, False]  # a key given twice counts once, as DEL; never-stored: none
    assert await store.delete(block_key(150))
    events = await in_process.drain()
    assert {(e["type"], e["medium"]) for e in events} == {("BlockRemoved", "CPU"), ("BlockRemoved", "STORAGE")}
    for medium in ("CPU", "STORAGE"):
        hashes = [h for e in events if e["medium"] == medium for h in e["block_hashes"]]
        assert sorted(hashes) == sorted(as_uint64(block_hash(i)) for i in range(151)), medium
    topics = {frames[0] for frames in in_process.frames[first:]}
    assert topics == {b"kv@node-a@" + NAMESPACE[:-1]}  # the other namespace saw nothing
    assert {k[: len(OTHER)] for k in store.block_keys("fs")} >= {OTHER}
    assert len(store.block_keys("fs")) == len(store.block_keys("l1")) == 200 - 151 + 1
