"""Strata's tier inside real vLLM on CPU (0.33, and 0.32's CPU build), configured by the ConfigMap the operator
renders, against a real `strata-kv` process.

vLLM runs in its own virtualenv (strata_testsupport.vllm); `engine.py` is the vLLM side. What cannot run without
a GPU is the worker's GPU→CPU copy: `engine.py` writes each chunk into the CPU primary tier's memory instead, the
bytes a worker would have copied there.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.connection import build_connection_config_map
from strata_operator.resources.kvcachetier.names import TierRef
from strata_testsupport.kvevents import Subscriber, as_uint64, block_key, listed_blocks
from strata_testsupport.kvserver import KVServerFactory, KVServerProcess
from strata_testsupport.vllm import VLLM_VERSIONS, VllmScript

pytestmark = pytest.mark.integration

ENGINE = Path(__file__).with_name("engine.py")
TIER = TierRef("kv", "serving", "uid-1")


def rendered_connection(spec: dict[str, Any]) -> dict[str, str]:
    """The `<tier>-connection` ConfigMap's data, from the operator's own builder."""
    data: dict[str, str] = build_connection_config_map(KVCacheTierSpec.model_validate(spec), TIER)["data"]
    return data


def pointed_at(connection: dict[str, str], server: KVServerProcess) -> str:
    """The rendered --kv-transfer-config with the Service host replaced by the test server's loopback port
    (the one thing that differs outside a cluster)."""
    transfer = json.loads(connection["KV_TRANSFER_CONFIG"])
    (tier,) = transfer["kv_connector_extra_config"]["secondary_tiers"]
    assert tier["url"] == "redis://kv.serving.svc:6379"
    tier["url"] = f"redis://127.0.0.1:{server.port}"
    return json.dumps(transfer)


@pytest.fixture(scope="module", params=sorted(VLLM_VERSIONS))
def vllm_engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[VllmScript]:
    """One vLLM-side process for the module (vLLM imports once); every request builds a fresh engine in it.
    The tiers rendered here use sha256_cbor, so the ConfigMap carries no PYTHONHASHSEED for the process."""
    script = VllmScript(ENGINE, tmp_path_factory.mktemp("vllm"), requirements=VLLM_VERSIONS[request.param])
    try:
        yield script
    finally:
        script.close()


def engine(
    vllm: VllmScript, mode: str, connection: dict[str, str], transfer: str, workdir: Path, **extra: Any
) -> dict[str, Any]:
    """One vLLM "engine" with the ConfigMap's values as `vllm serve` gets them."""
    assert "PYTHONHASHSEED" not in connection
    request = {
        "mode": mode,
        "workdir": str(workdir),
        "kv_transfer_config": transfer,
        "prefix_caching_hash_algo": connection["PREFIX_CACHING_HASH_ALGO"],
        "salt": "doc-1",
        **extra,
    }
    return vllm.call(request)


SMALL_TIER = {"chunkTokens": 64, "connector": {"cpuBytes": "8Mi"}, "auth": {"disabled": True}}


def test_a_second_engine_promotes_what_the_first_stored_bit_exact(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    server = kv_server_factory(l2_fs=False)
    connection = rendered_connection(SMALL_TIER)
    transfer = pointed_at(connection, server)

    stored = engine(vllm_engine, "store", connection, transfer, tmp_path, chunks=12)
    assert stored["stats"]["chunks_stored"] == 12
    assert stored["chunk_bytes"] == 64 * 2 * 2 * 2 * 64 * 2  # tokens x K,V x layers x kv heads x head dim x fp16
    assert server.client().stats()["l1_keys"] == 12

    loaded = engine(vllm_engine, "load", connection, transfer, tmp_path, chunks=12)
    assert loaded["namespace"] == stored["namespace"]
    assert loaded["verdicts"] == ["HIT"] * 12
    assert loaded["equal"] == 12, "a promoted chunk differs from what the first engine stored"
    assert loaded["sources"] == ["DISK"] * 12  # vLLM reports the hit as coming from a storage tier
    assert loaded["stats"]["chunks_loaded"] == 12


def test_two_revisions_of_a_model_never_hit_each_others_blocks_and_one_is_dropped_alone(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """The model path the webhook mounts (`<mount>/rev-<revision>`) becomes vLLM's model name, so its FileMapper
    puts each revision in its own namespace; the operator attributes that namespace to the path and drops it."""
    from strata_operator.resources.kvcachetier.namespaces import belongs, engine_model_path

    server = kv_server_factory(l2_fs=False)
    connection = rendered_connection(SMALL_TIER)
    transfer = pointed_at(connection, server)
    old, new = (engine_model_path("models/llama", r, None) for r in ("aaaaaaaaaaaa", "bbbbbbbbbbbb"))
    stored = engine(vllm_engine, "store", connection, transfer, tmp_path, chunks=6, model_path=old)
    assert stored["stats"]["chunks_stored"] == 6
    other = engine(vllm_engine, "load", connection, transfer, tmp_path, chunks=6, model_path=new)
    assert other["namespace"] != stored["namespace"]
    assert other["verdicts"] == ["MISS"] * 6, "the same prompt under other weights hits nothing"
    r = server.redis()
    held = json.loads(r.execute_command("STRATA.NAMESPACES"))
    (namespace,) = held
    assert belongs(namespace, str(tmp_path / old)) and not belongs(namespace, str(tmp_path / new))
    assert stored["namespace"] == f"{namespace}_r0/"
    engine(vllm_engine, "store", connection, transfer, tmp_path, chunks=6, model_path=new)
    dropped = json.loads(r.execute_command("STRATA.DROPNS", namespace))
    assert dropped["freed"]["l1"]["blocks"] == 6
    again = engine(vllm_engine, "load", connection, transfer, tmp_path, chunks=6, model_path=old)
    assert again["verdicts"] == ["MISS"] * 6
    kept = engine(vllm_engine, "load", connection, transfer, tmp_path, chunks=6, model_path=new)
    assert kept["verdicts"] == ["HIT"] * 6 and kept["equal"] == 6


def test_another_model_layout_never_hits(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """Block hashes do not name the model: the FileMapper namespace in the key is what keeps models apart."""
    server = kv_server_factory(l2_fs=False)
    connection = rendered_connection(SMALL_TIER)
    transfer = pointed_at(connection, server)
    engine(vllm_engine, "store", connection, transfer, tmp_path / "a", chunks=4)
    other = engine(
        vllm_engine, "lookup", connection, transfer, tmp_path / "b", chunks=4
    )  # same keys, another model path
    assert other["verdicts"] == ["MISS"] * 4
    assert other["stats"]["lookups"] == 4 and other["stats"].get("lookup_hits", 0) == 0


def test_with_the_server_killed_lookups_miss_and_nothing_hangs(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    server = kv_server_factory(l2_fs=False)
    connection = rendered_connection(SMALL_TIER)
    transfer = pointed_at(connection, server)
    engine(vllm_engine, "store", connection, transfer, tmp_path, chunks=4)
    server.kill()
    dead = engine(vllm_engine, "lookup", connection, transfer, tmp_path, chunks=4, steps=500)
    assert dead["verdicts"] == ["MISS"] * 4
    assert dead["stats"]["lookup_errors"] == 4
    stored = engine(vllm_engine, "store", connection, transfer, tmp_path, chunks=4, salt="doc-2")
    assert stored["stats"].get("chunks_stored", 0) == 0
    assert stored["stats"]["stores_failed"] + stored["stats"].get("stores_dropped", 0) == 4


def test_with_the_server_stalled_lookups_time_out_as_misses(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """A stopped process still completes TCP handshakes (the kernel does), then never answers: the slow-server
    case. The lookup timeout turns it into a miss, and the store into a drop, instead of a stuck request."""
    server = kv_server_factory(l2_fs=False)
    connection = rendered_connection(SMALL_TIER)
    transfer = pointed_at(connection, server)
    engine(vllm_engine, "store", connection, transfer, tmp_path, chunks=4)
    assert server.process is not None
    server.process.send_signal(signal.SIGSTOP)
    try:
        stalled = engine(vllm_engine, "lookup", connection, transfer, tmp_path, chunks=4, steps=1000)
        stored = engine(vllm_engine, "store", connection, transfer, tmp_path, chunks=4, salt="doc-2")
    finally:
        server.process.send_signal(signal.SIGCONT)
    assert stalled["verdicts"] == ["MISS"] * 4
    assert stalled["stats"]["lookup_errors"] == 4
    assert stored["stats"]["stores_failed"] == 4 and stored["stats"].get("chunks_stored", 0) == 0
    # Back from the stall, the server still holds what the first engine stored.
    assert engine(vllm_engine, "load", connection, transfer, tmp_path, chunks=4)["equal"] == 4


def test_a_real_scheduler_loads_the_prompt_chunks_the_tier_holds(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """vLLM's v1 Scheduler with the OffloadingConnector in its scheduler role, on a second engine: it looks the
    prompt's chunks up (keys from vLLM's own block hasher), promotes them from the Strata tier into its CPU tier
    and schedules a load job of those chunks for the worker, reported as hits from a storage tier."""
    server = kv_server_factory(l2_fs=False)
    connection = rendered_connection(SMALL_TIER)
    transfer = pointed_at(connection, server)
    prompt = [(7 * i) % 1000 + 1 for i in range(4 * 64 + 10)]  # four full 64-token chunks and a tail
    stored = engine(vllm_engine, "store", connection, transfer, tmp_path, prompt=prompt)
    assert stored["stats"]["chunks_stored"] == 4
    scheduled = engine(vllm_engine, "schedule", connection, transfer, tmp_path, prompt=prompt)
    assert scheduled["load_jobs"] == 1
    assert (scheduled["src_chunks"], scheduled["dst_gpu_blocks"]) == (4, 16)  # 4 chunks of 4 GPU blocks each
    assert scheduled["equal"] == 4, "the chunks the worker would copy to the GPU are not what was stored"
    assert scheduled["sources"] == ["DISK"] * 4
    assert scheduled["stats"]["lookup_hits"] == 4 and scheduled["stats"]["chunks_loaded"] == 4


def test_stored_chunks_are_reported_as_storage_kv_events(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """With vLLM's KV events on and the tier's `enable_kv_events` (not rendered by the operator yet: issue 12,
    item 5), the manager's take_events() carries the stored chunks with medium STORAGE."""
    server = kv_server_factory(l2_fs=False)
    connection = rendered_connection(SMALL_TIER)
    transfer = json.loads(pointed_at(connection, server))
    transfer["kv_connector_extra_config"]["secondary_tiers"][0]["enable_kv_events"] = True
    stored = engine(vllm_engine, "store", connection, json.dumps(transfer), tmp_path, chunks=3, kv_events=True)
    storage = [e for e in stored["storage_events"] if e["medium"] == "STORAGE"]
    assert storage == [{"medium": "STORAGE", "removed": False, "keys": stored["keys"]}]


def test_a_mounted_unix_socket_is_used_instead_of_the_service(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """Where the server's socket is mounted into the pod, the tier takes it (and falls back to `url` where the
    path does not exist); both reach the same server."""
    server = kv_server_factory(l2_fs=False)
    assert server.unix_socket
    connection = rendered_connection(SMALL_TIER)
    transfer = json.loads(pointed_at(connection, server))
    tier = transfer["kv_connector_extra_config"]["secondary_tiers"][0]
    tier["url"] = "redis://127.0.0.1:1"  # nothing listens there: only the socket can work
    tier["unix_socket"] = server.unix_socket
    stored = engine(vllm_engine, "store", connection, json.dumps(transfer), tmp_path, chunks=3)
    assert stored["stats"]["chunks_stored"] == 3
    tier["url"], tier["unix_socket"] = f"redis://127.0.0.1:{server.port}", str(tmp_path / "not-mounted.sock")
    loaded = engine(vllm_engine, "load", connection, json.dumps(transfer), tmp_path, chunks=3)
    assert loaded["equal"] == 3


def test_over_the_node_socket_loads_take_the_servers_memory_and_are_bit_exact(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """A tier with `nodeSocket.sharedMemory`: 1 MiB chunks (1024 tokens of this model's 1 KiB) stored over the
    socket come back into vLLM's CPU tier as the server's memory (STRATA.GETFD), bit-exact."""
    server = kv_server_factory({"listen": {"shared_memory": True}}, l2_fs=False)
    spec = {**SMALL_TIER, "chunkTokens": 1024, "connector": {"cpuBytes": "16Mi"}}
    connection = rendered_connection({**spec, "nodeSocket": {"enabled": True, "sharedMemory": True}})
    transfer = json.loads(pointed_at(connection, server))
    tier = transfer["kv_connector_extra_config"]["secondary_tiers"][0]
    assert tier["unix_socket"] == "/run/strata-kv/kv.sock"
    tier["unix_socket"] = server.unix_socket  # where the CSI volume would mount it
    stored = engine(vllm_engine, "store", connection, json.dumps(transfer), tmp_path, chunks=3)
    assert stored["stats"]["chunks_stored"] == 3
    loaded = engine(vllm_engine, "load", connection, json.dumps(transfer), tmp_path, chunks=3)
    assert loaded["equal"] == 3
    assert int(server.client().stats()["shared_replies"]) == 3, "every chunk came as the server's memory"


def test_the_servers_kv_events_decode_with_vllms_own_kv_event_batch(
    vllm_engine: VllmScript,
    kv_server_factory: KVServerFactory,
    tmp_path: Path,
) -> None:
    """What vLLM's tier stores into a server with events on comes out as events vLLM's own decoder parses
    (KVEventBatch via msgspec, in `engine.py`), with the hashes vLLM itself would publish for those blocks."""
    server = kv_server_factory({"events": {"publish": "tcp://127.0.0.1:*", "topic": "kv@node-a@{namespace}"}})
    connection = rendered_connection(SMALL_TIER)
    transfer = pointed_at(connection, server)
    sub = Subscriber(server)
    sub.join()

    stored = engine(vllm_engine, "store", connection, transfer, tmp_path, chunks=6)
    assert stored["stats"]["chunks_stored"] == 6
    namespace = stored["namespace"].encode()
    keys = [bytes.fromhex(k) for k in stored["keys"]]
    sub.settled_stats()  # in L1 and written to L2
    sub.redis.delete(namespace + keys[0])  # the first block is gone again, from both
    sub.drain(marker_namespace=namespace)

    decoded = vllm_engine.call(
        {
            "mode": "decode_events",
            "workdir": str(tmp_path),
            "frames": [[f.hex() for f in frames] for frames in sub.raw],
            "offload_keys": stored["keys"],
        }
    )
    batches = decoded["batches"]
    assert [b["seq"] for b in batches] == list(range(batches[0]["seq"], batches[0]["seq"] + len(batches)))
    assert {b["topic"] for b in batches} == {f"kv@node-a@{stored['namespace'].rstrip('/')}"}
    marker = as_uint64(b"\xee" * 32)
    events = [e for b in batches for e in b["events"] if e["block_hashes"] != [marker]]
    stored_events = [e for e in events if e["type"] == "BlockStored"]
    removed_events = [e for e in events if e["type"] == "BlockRemoved"]
    cpu, storage = decoded["media"][1:]  # vLLM's MEDIUM_CPU (the server's DRAM), MEDIUM_STORAGE (its L2)
    assert [e["block_hashes"] for e in stored_events if e["medium"] == cpu] == [[h] for h in decoded["vllm_hashes"]]
    assert sorted(e["block_hashes"] for e in stored_events if e["medium"] == storage) == sorted(
        [h] for h in decoded["vllm_hashes"]
    )
    assert [(e["medium"], e["block_hashes"]) for e in removed_events] == [
        (cpu, [decoded["vllm_hashes"][0]]),
        (storage, [decoded["vllm_hashes"][0]]),
    ]
    assert all(e["group_idx"] == 0 and e["locality"] == "LOCAL" and e["token_ids"] == [] for e in stored_events)


def test_evictions_and_a_namespace_drop_decode_with_vllms_own_types(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """A stream with L1 evictions (CPU), L2 watermark evictions (STORAGE) and a DEL of many blocks (removals merged
    into BlockRemoved events of many hashes) decodes with vLLM's KVEventBatch, and the per-medium index built from
    vLLM's decoded events is what the server lists for each tier."""
    config = {
        "events": {"publish": "tcp://127.0.0.1:*", "topic": "kv@node-a@{namespace}"},
        "l1": {"size": "256KiB", "eviction_policy": "lru"},
        "l2": {"fs": {"capacity": "1MiB", "high_watermark": 0.9, "low_watermark": 0.5, "rescan_interval_seconds": 0}},
    }
    sub = Subscriber(kv_server_factory(config))
    sub.join()
    for i in range(40):  # 40 x 48 KiB through an L1 of ~5 and an L2 of ~18
        sub.redis.set(block_key(i, group=i % 3), b"v" * 48 * 1024)
    sub.settled_stats()
    sub.redis.delete(*[block_key(i, group=i % 3) for i in range(30, 40)])
    stats = sub.settled_stats()
    assert stats["l1_evictions"] > 0 and stats["fs_evictions"] > 0
    sub.drain()
    assert not sub.gaps, f"messages lost (expected seq, got seq): {sub.gaps}"

    decoded = vllm_engine.call(
        {"mode": "decode_events", "workdir": str(tmp_path), "frames": [[f.hex() for f in fr] for fr in sub.raw]}
    )
    raw_events = [e for fr in sub.raw for e in msgpack.unpackb(fr[2])[1]]
    vllm_events = [e for b in decoded["batches"] for e in b["events"]]
    assert [(e["type"], e["block_hashes"], e["medium"]) for e in vllm_events] == [
        (e["type"], e["block_hashes"], e["medium"]) for e in raw_events
    ]
    assert {e["medium"] for e in vllm_events} == set(decoded["media"][1:])
    index: dict[str, set[tuple[int, int]]] = {}
    for e in vllm_events:
        blocks = {(h, e["group_idx"]) for h in e["block_hashes"]}
        held = index.setdefault(e["medium"], set())
        if e["type"] == "BlockStored":
            held |= blocks
        else:
            held -= blocks
    for medium, tier in zip(decoded["media"][1:], ("l1", "fs"), strict=True):
        assert index[medium] == {(h, g) for _ns, h, g in listed_blocks(sub.server, tier)}, medium
    sub.close()


# -- one directory shared with vLLM's own `fs` tier ---------------------------------------------------------------
TRAILER_BYTES = 24  # strata_kv.store.blockfile.TRAILER_SIZE


def with_vllm_fs_tier(connection: dict[str, str], root: Path) -> str:
    """The rendered --kv-transfer-config with vLLM's own `fs` tier on `root` in place of Strata's tier: what a
    serving pod that mounts the tier's L2 directory could run instead (same CPU tier, chunk size, hash)."""
    transfer = json.loads(connection["KV_TRANSFER_CONFIG"])
    transfer["kv_connector_extra_config"]["secondary_tiers"] = [{"type": "fs", "root_dir": str(root)}]
    return json.dumps(transfer)


def block_files(root: Path, namespace: str) -> list[Path]:
    return sorted((root / namespace.rstrip("/")).rglob("*.bin"))


def wait_until(predicate: Any, timeout: float = 60.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return bool(predicate())


def test_the_strata_tier_loads_bit_exact_what_vllms_own_fs_tier_wrote(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """Engine A runs vLLM's `fs` tier on the server's L2 directory; engine B (same model and layout) the Strata tier.
    B's chunks miss the server's DRAM and come from vLLM's raw block files, bit-exact."""
    l2 = tmp_path / "l2"
    server = kv_server_factory({"l2": {"fs": {"root_dir": str(l2)}}})
    connection = rendered_connection(SMALL_TIER)
    stored = engine(vllm_engine, "store", connection, with_vllm_fs_tier(connection, l2), tmp_path, chunks=6)
    files = block_files(l2, stored["namespace"])
    assert len(files) == 6 and {f.stat().st_size for f in files} == {stored["chunk_bytes"]}  # raw: no trailer

    loaded = engine(vllm_engine, "load", connection, pointed_at(connection, server), tmp_path, chunks=6)
    assert loaded["namespace"] == stored["namespace"]  # both sides name the same directory
    assert loaded["verdicts"] == ["HIT"] * 6
    assert loaded["equal"] == 6, "a chunk read from vLLM's block file differs from what vLLM stored"
    stats = server.client().stats()
    assert stats["hits_fs"] == 6 and stats["fs_foreign_served"] == 6
    assert block_files(l2, stored["namespace"]) == files  # read, never rewritten or removed


def test_vllms_own_fs_tier_loads_bit_exact_what_the_strata_tier_stored(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """The reverse: the Strata tier stores, the server writes its block files (value, key, trailer) at vLLM's paths,
    and an engine with vLLM's own `fs` tier on that directory reads them as its own blocks (`block_size` bytes from
    offset 0)."""
    l2 = tmp_path / "l2"
    server = kv_server_factory({"l2": {"fs": {"root_dir": str(l2)}}})
    connection = rendered_connection(SMALL_TIER)
    stored = engine(vllm_engine, "store", connection, pointed_at(connection, server), tmp_path, chunks=6)
    assert stored["stats"]["chunks_stored"] == 6
    assert wait_until(lambda: len(block_files(l2, stored["namespace"])) == 6), "write-behind never reached L2"
    files = block_files(l2, stored["namespace"])
    key_bytes = len(stored["namespace"]) + 36
    assert {f.stat().st_size for f in files} == {stored["chunk_bytes"] + key_bytes + TRAILER_BYTES}
    config = l2 / stored["namespace"].rstrip("/").rsplit("_r", 1)[0] / "config.json"
    assert not config.exists()  # the server cannot rebuild vLLM's fields from a key: vLLM writes it

    loaded = engine(vllm_engine, "load", connection, with_vllm_fs_tier(connection, l2), tmp_path, chunks=6)
    assert loaded["namespace"] == stored["namespace"]
    assert loaded["verdicts"] == ["HIT"] * 6
    assert loaded["equal"] == 6, "vLLM's fs tier read something else than the Strata tier stored"
    assert loaded["sources"] == ["DISK"] * 6
    assert config.is_file()  # vLLM's own, written when its tier started


def test_strata_evicting_vllms_files_costs_vllm_a_recompute_never_a_failed_request(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """vLLM's `fs` tier writes a prompt's chunks; the server, started on that directory with a small capacity, counts
    them; a real Scheduler with vLLM's fs tier looks them up (present), and before its load the server's watermark
    evicts them. vLLM's load finds them gone and recomputes the prompt: the request is scheduled, nothing fails."""
    l2 = tmp_path / "l2"
    connection = rendered_connection(SMALL_TIER)
    fs_transfer = with_vllm_fs_tier(connection, l2)
    prompt = [(11 * i) % 1000 + 1 for i in range(4 * 64 + 10)]  # four full 64-token chunks and a tail
    stored = engine(vllm_engine, "store", connection, fs_transfer, tmp_path, prompt=prompt)
    files = block_files(l2, stored["namespace"])
    assert len(files) == 4
    chunk = stored["chunk_bytes"]
    server = kv_server_factory(
        {"l1": {"size": "2MiB"}, "l2": {"fs": {"root_dir": str(l2), "capacity": 10 * chunk, "low_watermark": 0.3}}}
    )
    assert server.client().stats()["fs_files"] == 4  # the start-up scan found vLLM's files

    intact = engine(vllm_engine, "schedule", connection, fs_transfer, tmp_path, prompt=prompt)
    assert (intact["load_jobs"], intact["equal"]) == (1, 4)  # untouched, they are loadable

    evicted = engine(
        vllm_engine,
        "schedule",
        connection,
        fs_transfer,
        tmp_path,
        prompt=prompt,
        evict_before_load={"port": server.port, "value_bytes": chunk},
    )
    assert evicted["evictions"]["evicted"] == evicted["evictions"]["looked_up"] == 4
    assert not any(f.exists() for f in files)
    assert evicted["load_jobs"] == 0 and evicted["scheduled_tokens"] == len(prompt)  # recomputed, scheduled
    assert server.client().stats()["fs_evictions"] >= 4


PROMPT = [(7 * i) % 1000 + 1 for i in range(4 * 64 + 10)]  # four full 64-token chunks and a tail


def test_the_tiers_counters_reach_vllms_prometheus_metrics_and_log_line(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """Engine 0 stores a prompt's four chunks in two jobs, engine 1 (a real Scheduler) promotes them; vLLM's own
    frontend metrics (`KVConnectorProm`, series from the tier's `build_metric_definitions`) and log line report the
    tier's counters per engine, and agree with what vLLM itself counts for the tier."""
    server = kv_server_factory(l2_fs=False)
    connection = rendered_connection(SMALL_TIER)
    transfer = pointed_at(connection, server)
    out = engine(vllm_engine, "metrics", connection, transfer, tmp_path, prompt=PROMPT, store_jobs=[2, 2])
    prom, chunk = out["prometheus"], out["chunk_bytes"]
    assert out["keys"] == 4 and chunk == 64 * 2 * 2 * 2 * 64 * 2

    strata = "vllm:kv_offload_strata_"
    assert prom[strata + "store_bytes_total{engine=0}"] == 4 * chunk
    assert prom[strata + "store_chunks_total{engine=0}"] == 4
    assert prom[strata + "store_jobs_total{engine=0}"] == 2
    assert prom[strata + "load_bytes_total{engine=1}"] == 4 * chunk
    assert prom[strata + "load_chunks_total{engine=1}"] == 4
    assert prom[strata + "lookup_chunks_total{engine=1,result=hit}"] == 4
    assert prom.get(strata + "lookup_chunks_total{engine=1,result=miss}", 0) == 0
    assert prom[strata + "connects_total{engine=0}"] >= 1
    assert prom[strata + "pending_store_bytes{engine=0}"] == 0
    assert not [k for k in prom if "dropped" in k or "failed" in k or "missing" in k or "breaker" in k]
    assert f"{strata}store_bytes={4 * chunk}" in out["log"] and f"{strata}load_bytes={4 * chunk}" in out["log"]
    # What vLLM counts for the tier (label `<n>:<type>`) agrees with what the tier counts.
    assert prom["vllm:kv_offload_tiering_write_bytes_total{engine=0,tier=1:StrataTier}"] == 4 * chunk
    assert prom["vllm:kv_offload_tiering_read_bytes_total{engine=1,tier=1:StrataTier}"] == 4 * chunk


def test_a_killed_server_shows_in_vllms_metrics_as_failed_then_dropped_stores(
    vllm_engine: VllmScript, kv_server_factory: KVServerFactory, tmp_path: Path
) -> None:
    """With the server gone, the first store job fails (and opens the breaker: threshold 1 here, and no probe
    for an hour), the second is dropped without a try, and the second engine's lookups are errors (misses for
    vLLM, which then computes the prompt)."""
    server = kv_server_factory(l2_fs=False)
    connection = rendered_connection(SMALL_TIER)
    transfer = json.loads(pointed_at(connection, server))
    transfer["kv_connector_extra_config"]["secondary_tiers"][0].update(failure_threshold=1, reset_after_s=3600)
    server.kill()
    out = engine(vllm_engine, "metrics", connection, json.dumps(transfer), tmp_path, prompt=PROMPT, store_jobs=[2, 2])
    prom = out["prometheus"]

    strata = "vllm:kv_offload_strata_"
    assert prom[strata + "store_jobs_total{engine=0}"] == 2
    assert prom[strata + "store_failed_chunks_total{engine=0}"] == 2
    assert prom[strata + "stores_dropped_chunks_total{engine=0,reason=unavailable}"] == 2
    assert prom.get(strata + "stores_dropped_chunks_total{engine=0,reason=queue_full}", 0) == 0
    assert prom[strata + "breaker_opens_total{engine=0}"] == 1
    assert prom.get(strata + "store_bytes_total{engine=0}", 0) == 0
    assert prom[strata + "lookup_chunks_total{engine=1,result=error}"] == out["reader_stats"]["lookup_errors"] == 4
    assert prom.get(strata + "lookup_chunks_total{engine=1,result=hit}", 0) == 0
    assert f"{strata}stores_dropped_chunks:('unavailable',)=2" in out["log"]
    assert prom["vllm:kv_offload_tiering_cascade_job_failures_total{engine=0,tier=1:StrataTier}"] == 2
