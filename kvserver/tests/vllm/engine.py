"""The vLLM side of the tier tests and the bench: run with vLLM's own python (strata_testsupport.vllm), never
imported by pytest (it imports vllm).

Reads JSON requests on stdin, one per line, and answers each with one JSON line. It builds vLLM's config from the
`--kv-transfer-config` JSON and `--prefix-caching-hash-algo` the operator rendered (EngineArgs, as `vllm serve`
parses them), a config-only model directory and a hand-made KVCacheConfig (the GPU worker cannot run here), then
lets vLLM's own `build_offloading_config` + `OffloadingSpecFactory` build the TieringOffloadingSpec, whose
manager loads the Strata tier by `module_path`. The GPU→CPU copy a worker would do is a write into the primary
tier's memory (`primary_kv_view`), as vLLM's own tiering tests do.

Modes:
- `store`: one request stores `chunks` chunks (content derived from each key) through the manager; they cascade
  into the Strata tier; waits until the tier reports every job finished.
- `load`: a second engine looks the same keys up, lets vLLM promote them from the Strata tier, and compares every
  chunk's bytes with what was stored.
- `lookup`: looks keys up for at most `steps` scheduler steps and reports what vLLM decided (the dead-server test).
- `schedule`: a real v1 Scheduler with the OffloadingConnector schedules a prompt whose chunks the tier holds.
- `bench`: `store` then `load`, timed, for whichever secondary tier the config names (bench/vllm_tier.py).
- `metrics`: one engine stores a prompt's chunks in jobs, a second (a real Scheduler) loads them; both engines'
  stats payloads go through vLLM's own Prometheus metrics and log-line aggregation, as the frontend does.

`store`, `load` and `schedule` work with whichever one secondary tier the config names: Strata's, or vLLM's own
`fs` tier (the shared-directory tests). `schedule` can make the server evict between vLLM's lookup and its load
(`evict_before_load`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch
from strata_kv.vllm.compat import manager_lock, request_block_hasher
from vllm.config.kv_events import KVEventsConfig
from vllm.distributed.kv_transfer.kv_connector.v1.offloading.config import build_offloading_config
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, KVCacheTensor
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.factory import OffloadingSpecFactory
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

MODEL_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "num_hidden_layers": 2,
    "vocab_size": 1024,
    "max_position_embeddings": 4096,
    "torch_dtype": "float16",
    "rms_norm_eps": 1e-5,
}
RESULT_MARK = "STRATA-RESULT "  # strata_testsupport.vllm.RESULT_MARK: vLLM logs to stdout too
GPU_BLOCK_TOKENS = 16
NUM_GPU_BLOCKS = 256


def write_model_dir(path: Path, config: dict[str, Any]) -> Path:
    """A config-only model directory: all EngineArgs and the scheduler read (no weights, no tokenizer)."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config))
    return path


def kv_cache_config(model: dict[str, Any], num_blocks: int = NUM_GPU_BLOCKS) -> KVCacheConfig:
    """The KV cache a GPU worker of this model would report: one full-attention group over every layer."""
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(model["num_hidden_layers"])]
    spec = FullAttentionSpec(
        block_size=GPU_BLOCK_TOKENS,
        num_kv_heads=model["num_key_value_heads"],
        head_size=model["head_dim"],
        dtype=torch.float16,
    )
    page = spec.page_size_bytes
    tensor = KVCacheTensor(
        size=page * num_blocks * len(layers), layers=layers, layer_stride=page * num_blocks, block_stride=page
    )
    return KVCacheConfig(
        num_blocks=num_blocks, kv_cache_tensors=[tensor], kv_cache_groups=[KVCacheGroupSpec(layers, spec)]
    )


def vllm_config(request: dict[str, Any], engine_id: str) -> Any:
    """What `vllm serve <model> --kv-transfer-config <json> --prefix-caching-hash-algo <algo>` would build."""
    transfer = json.loads(request["kv_transfer_config"])
    transfer["engine_id"] = engine_id
    events = bool(request.get("kv_events"))
    args = EngineArgs(
        model=request["model_dir"],
        skip_tokenizer_init=True,
        kv_transfer_config=transfer,
        prefix_caching_hash_algo=request["prefix_caching_hash_algo"],
        block_size=GPU_BLOCK_TOKENS,
        max_model_len=request.get("max_model_len", 4096),
        enable_prefix_caching=True,
        load_format="dummy",
        kv_events_config=KVEventsConfig(enable_kv_cache_events=True, publisher="null") if events else None,
    )
    config = args.create_engine_config()
    config.cache_config.num_gpu_blocks = NUM_GPU_BLOCKS
    return config


_ENGINES = itertools.count(1)
_OPEN: list[Any] = []
"""Managers and schedulers of the current request: a request that fails still releases their /dev/shm regions."""


def close(owner: Any) -> None:
    _OPEN.remove(owner)
    owner.shutdown()


def build_manager(request: dict[str, Any], role: str) -> tuple[Any, Any, Any]:
    """A fresh engine's config, offloading spec and manager (its own engine id, so its own /dev/shm region)."""
    config = vllm_config(request, f"{role}-{next(_ENGINES)}")
    model = json.loads(Path(request["model_dir"], "config.json").read_text())
    offloading = build_offloading_config(config, kv_cache_config(model))
    spec = OffloadingSpecFactory.create_spec(offloading)
    manager = spec.get_manager()
    _OPEN.append(manager)
    return config, spec, manager


def prompt_request(config: Any, request_id: str, tokens: list[int]) -> Any:
    """A v1 Request whose block hashes vLLM computes as its engine core does (algorithm, NONE_HASH seed)."""
    hash_fn = get_hash_fn_by_name(config.cache_config.prefix_caching_hash_algo)
    init_none_hash(hash_fn)
    hasher = request_block_hasher(GPU_BLOCK_TOKENS, hash_fn, config)
    return Request(request_id, tokens, SamplingParams(max_tokens=1), None, block_hasher=hasher)


def prompt_keys(config: Any, tokens: list[int]) -> list[bytes]:
    """The offload keys vLLM's connector gives this prompt's full chunks: each chunk's last block hash + group 0."""
    blocks_per_chunk = config.kv_transfer_config.kv_connector_extra_config["block_size"] // GPU_BLOCK_TOKENS
    hashes = prompt_request(config, "keys", tokens).block_hashes
    return [make_offload_key(h, 0) for h in hashes[blocks_per_chunk - 1 :: blocks_per_chunk]]


def chunk_keys(count: int, salt: str) -> list[bytes]:
    """Offload keys of one prefix chain (32-byte block hashes, as sha256 gives, + group 0)."""
    keys, parent = [], salt.encode()
    for _ in range(count):
        parent = hashlib.sha256(parent).digest()
        keys.append(make_offload_key(parent, 0))
    return keys


def content(key: bytes, size: int) -> np.ndarray:
    """A chunk's bytes, derived from its key: any mix-up of chunks or offsets shows."""
    seed = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return np.random.default_rng(seed).integers(0, 256, size, dtype=np.uint8)


def strata_tier(manager: Any) -> Any:
    (tier,) = [t for t in manager.secondary_tiers if type(t).__name__ == "StrataTier"]
    return tier


def secondary_tier(manager: Any) -> Any:
    """The one secondary tier the config names: Strata's, or vLLM's own `fs` tier."""
    (tier,) = manager.secondary_tiers
    return tier


def tier_namespace(tier: Any) -> str:
    """`<model>_<digest12>_r<rank>/`: the StrataTier's key prefix, or the directory vLLM's fs tier writes into."""
    if hasattr(tier, "namespace"):
        return str(tier.namespace.decode())
    mapper = tier.file_mapper
    return f"{os.path.basename(mapper.base_path)}_r{mapper.rank}/"


def tier_stats(tier: Any) -> dict[str, int]:
    return dict(tier.stats()) if hasattr(tier, "stats") else {}


def evict_before_load(tier: Any, request: dict[str, Any], report: dict[str, Any]) -> None:
    """Make the first load of vLLM's fs tier wait until the Strata server has evicted the files it is about to read.

    A stand-in for timing only: the test cannot otherwise place the server's eviction between vLLM's lookup (the
    files existed) and its load. The eviction itself is the server's own: this SETs new chunks into it until its
    watermark removes the oldest block files (the ones vLLM wrote), then lets vLLM's load run against what is
    left."""
    from strata_kv.client import KVClient

    ask = request["evict_before_load"]
    original = tier.submit_load

    def submit_load(job: Any) -> None:
        if "evicted" not in report:
            paths = [tier.file_mapper.get_file_name(k) for k in job.keys]
            client = KVClient("127.0.0.1", ask["port"])
            try:
                deadline, i = time.monotonic() + 120, 0
                while any(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
                    client.set(b"pressure-%d" % i, bytes(ask["value_bytes"]))
                    i += 1
                    time.sleep(0.05)
            finally:
                client.close()
            report["evicted"] = sum(not os.path.exists(p) for p in paths)
            report["looked_up"] = len(paths)
            report["pressure_sets"] = i
        original(job)

    tier.submit_load = submit_load


def primary_bytes(manager: Any) -> np.ndarray:
    view = manager.primary_tier.get_kv_memoryview()
    return np.frombuffer(view.cast("B"), dtype=np.uint8).reshape(view.shape[0], -1)


def step(manager: Any) -> None:
    with manager_lock(manager):
        manager.on_schedule_end(ScheduleEndContext((), ()))


def write_and_offload(manager: Any, keys: list[bytes], ctx: ReqContext, memory: np.ndarray) -> None:
    """One request's store: the primary tier takes `keys`, each chunk's bytes are written where a worker's
    GPU→CPU copy would put them, and the store completes (which cascades it into the secondary tier)."""
    with manager_lock(manager):
        manager.on_new_request(ctx)
        out = manager.prepare_store(keys, ctx)
        assert out is not None and list(out.keys_to_store) == keys, "the primary tier refused the store"
        for key, chunk_id in zip(keys, out.store_spec.chunk_ids, strict=True):
            memory[chunk_id][:] = content(key, memory.shape[1])  # the GPU→CPU copy
        manager.complete_store(keys, ctx)


def store(request: dict[str, Any]) -> dict[str, Any]:
    config, _spec, manager = build_manager(request, "store")
    tier = secondary_tier(manager)
    if "prompt" in request:
        keys = prompt_keys(config, request["prompt"])
    else:
        keys = chunk_keys(request["chunks"], request["salt"])
    ctx = ReqContext(req_id="store-1")
    memory = primary_bytes(manager)
    write_and_offload(manager, keys, ctx, memory)
    start = time.monotonic()
    tier.drain_jobs()
    elapsed = time.monotonic() - start
    step(manager)  # ends the step of prepare_store (which already polled the tiers in it)
    step(manager)  # the next step collects the finished store jobs (and their events)
    with manager_lock(manager):
        manager.on_request_finished(ctx)
        events = [e for e in manager.take_events() if e.ownership is not None or e.medium.name == "STORAGE"]
    stats = tier_stats(tier)
    close(manager)
    return {
        "namespace": tier_namespace(tier),
        "storage_events": [
            {"medium": e.medium.name, "removed": e.removed, "keys": [bytes(k).hex() for k in e.keys]} for e in events
        ],
        "keys": [bytes(k).hex() for k in keys],
        "chunk_bytes": int(memory.shape[1]),
        "stats": stats,
        "drain_seconds": elapsed,
    }


def lookup_until_settled(manager: Any, keys: list[bytes], ctx: Any, steps: int, pause: float = 0.01) -> list[str]:
    """Ask vLLM's manager for each key every step (as the scheduler does) until none is pending."""
    verdicts: list[str] = []
    for _ in range(steps):
        with manager_lock(manager):
            verdicts = [manager.lookup(k, ctx).name for k in keys]
        if all(v in (LookupResult.HIT.name, LookupResult.MISS.name) for v in verdicts):
            break
        step(manager)
        time.sleep(pause)
    return verdicts


def load(request: dict[str, Any]) -> dict[str, Any]:
    _config, _spec, manager = build_manager(request, "load")
    tier = secondary_tier(manager)
    keys = chunk_keys(request["chunks"], request["salt"])
    ctx = ReqContext(req_id="load-1")
    with manager_lock(manager):
        manager.on_new_request(ctx)
    verdicts = lookup_until_settled(manager, keys, ctx, request.get("steps", 2000))
    hits = [k for k, v in zip(keys, verdicts, strict=True) if v == LookupResult.HIT.name]
    equal = 0
    sources: list[str] = []
    if hits:
        memory = primary_bytes(manager)
        with manager_lock(manager):
            load_spec = manager.prepare_load(hits, ctx)
            sources = [manager.get_load_source(k, ctx).name for k in hits]
        for key, chunk_id in zip(hits, load_spec.chunk_ids, strict=True):
            equal += bool(np.array_equal(memory[chunk_id], content(key, memory.shape[1])))
        with manager_lock(manager):
            manager.complete_load(hits, ctx)
    with manager_lock(manager):
        manager.on_request_finished(ctx)
    stats = tier_stats(tier)
    close(manager)
    return {
        "namespace": tier_namespace(tier),
        "verdicts": verdicts,
        "equal": equal,
        "sources": sources,
        "stats": stats,
    }


def lookup(request: dict[str, Any]) -> dict[str, Any]:
    _config, _spec, manager = build_manager(request, "lookup")
    tier = strata_tier(manager)
    keys = chunk_keys(request["chunks"], request["salt"])
    ctx = ReqContext(req_id="lookup-1")
    with manager_lock(manager):
        manager.on_new_request(ctx)
    verdicts = lookup_until_settled(manager, keys, ctx, request.get("steps", 2000))
    with manager_lock(manager):
        manager.on_request_finished(ctx)
    stats = tier.stats()
    close(manager)
    return {"verdicts": verdicts, "stats": stats}


def schedule(request: dict[str, Any]) -> dict[str, Any]:
    """A real v1 Scheduler with the OffloadingConnector in the scheduler role: the prompt is scheduled once vLLM
    has promoted its chunks from the Strata tier, with a load job (CPU→GPU, for the worker) for those blocks."""
    config = vllm_config(request, f"schedule-{next(_ENGINES)}")
    model = json.loads(Path(request["model_dir"], "config.json").read_text())
    scheduler = Scheduler(config, kv_cache_config(model), StructuredOutputManager(config), GPU_BLOCK_TOKENS)
    _OPEN.append(scheduler)
    req = prompt_request(config, "prompt-1", request["prompt"])
    manager = scheduler.connector.connector_scheduler.manager
    tier = secondary_tier(manager)
    evictions: dict[str, Any] = {}
    if "evict_before_load" in request:
        evict_before_load(tier, request, evictions)
    scheduler.add_request(req)
    load_jobs: list[Any] = []
    steps = scheduled_tokens = 0
    while steps < request.get("steps", 2000):
        steps += 1
        out = scheduler.schedule()
        load_jobs = list(out.kv_connector_metadata.load_jobs.values())
        scheduled_tokens = out.num_scheduled_tokens.get(req.request_id, 0)
        if load_jobs or scheduled_tokens:
            break
        time.sleep(0.01)
    expected = prompt_keys(config, request["prompt"])
    jobs = [job for job in load_jobs if job.req_id == req.request_id]
    src_chunks = [int(c) for job in jobs for c in np.asarray(job.src_spec.block_ids).ravel()]
    dst_blocks = sum(int(np.asarray(job.dst_spec.block_ids).size) for job in jobs)
    memory = primary_bytes(manager)
    equal = sum(
        bool(np.array_equal(memory[c], content(k, memory.shape[1]))) for k, c in zip(expected, src_chunks, strict=False)
    )
    with manager_lock(manager):
        sources = [manager.get_load_source(k, ReqContext(req_id=req.request_id)).name for k in expected]
    result = {
        "steps": steps,
        "load_jobs": len(jobs),
        "src_chunks": len(src_chunks),
        "dst_gpu_blocks": dst_blocks,
        "equal": equal,
        "sources": sources,
        "scheduled_tokens": scheduled_tokens,
        "stats": tier_stats(tier),
        "evictions": evictions,
    }
    close(scheduler)
    return result


def bench(request: dict[str, Any]) -> dict[str, Any]:
    """Store `chunks` chunks from one engine's CPU tier into its secondary tier, then promote them into a second
    engine's, timing each phase in wall-clock seconds (bench/vllm_tier.py; the tier is whatever the config names).
    Every promoted chunk is compared with what was stored, outside the timed part."""
    keys = chunk_keys(request["chunks"], request["salt"])
    _config, _spec, writer = build_manager(request, "bench-store")
    memory = primary_bytes(writer)
    chunk_bytes = int(memory.shape[1])
    ctx = ReqContext(req_id="bench-store")
    with manager_lock(writer):
        writer.on_new_request(ctx)
        out = writer.prepare_store(keys, ctx)
        assert out is not None and list(out.keys_to_store) == keys, "the primary tier refused the store"
    for key, chunk_id in zip(keys, out.store_spec.chunk_ids, strict=True):
        memory[chunk_id][:] = content(key, chunk_bytes)
    start = time.monotonic()
    with manager_lock(writer):
        writer.complete_store(keys, ctx)
    (tier,) = writer.secondary_tiers
    tier.drain_jobs()
    store_seconds = time.monotonic() - start
    step(writer)
    with manager_lock(writer):
        writer.on_request_finished(ctx)
    close(writer)

    if request.get("drop_caches_before_load"):  # a cold read of what the fs tier wrote (needs root)
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    _config, _spec, reader = build_manager(request, "bench-load")
    ctx = ReqContext(req_id="bench-load")
    with manager_lock(reader):
        reader.on_new_request(ctx)
    start = time.monotonic()
    verdicts = lookup_until_settled(reader, keys, ctx, request.get("steps", 100000), pause=0.0005)
    load_seconds = time.monotonic() - start
    hits = [k for k, v in zip(keys, verdicts, strict=True) if v == LookupResult.HIT.name]
    equal = 0
    if hits:
        memory = primary_bytes(reader)
        with manager_lock(reader):
            load_spec = reader.prepare_load(hits, ctx)
        for key, chunk_id in zip(hits, load_spec.chunk_ids, strict=True):
            equal += bool(np.array_equal(memory[chunk_id], content(key, chunk_bytes)))
        with manager_lock(reader):
            reader.complete_load(hits, ctx)
    with manager_lock(reader):
        reader.on_request_finished(ctx)
    close(reader)
    return {
        "chunk_bytes": chunk_bytes,
        "chunks": len(keys),
        "store_seconds": store_seconds,
        "load_seconds": load_seconds,
        "hits": len(hits),
        "equal": equal,
    }


def store_in_jobs(manager: Any, keys: list[bytes], sizes: list[int]) -> list[Any]:
    """Store `keys` as one request (and so one store job into the secondary tier) per entry of `sizes`, each
    drained and collected before the next, as a worker's successive offloads would come. Returns the manager's
    stats payload after each job (vLLM's scheduler takes one every step)."""
    payloads = []
    memory = primary_bytes(manager)
    tier = strata_tier(manager)
    start = 0
    for i, size in enumerate(sizes):
        job_keys, start = keys[start : start + size], start + size
        ctx = ReqContext(req_id=f"store-{i}")
        write_and_offload(manager, job_keys, ctx, memory)
        tier.drain_jobs()
        step(manager)
        step(manager)
        with manager_lock(manager):
            manager.on_request_finished(ctx)
            payloads.append(manager.get_stats())
    return payloads


def prometheus_samples(config: Any, payloads: list[tuple[int, Any]]) -> dict[str, float]:
    """vLLM's frontend side: `KVConnectorProm` (the OffloadingConnector's `OffloadPromMetrics`, whose series come
    from the spec's and so the tiers' `build_metric_definitions`) observes each engine's payload; read back from
    a registry of this call's own (vLLM's default is the process-global one)."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorProm

    registry = CollectorRegistry()

    class Prom(KVConnectorProm):
        _gauge_cls = functools.partial(Gauge, registry=registry)
        _counter_cls = functools.partial(Counter, registry=registry)
        _histogram_cls = functools.partial(Histogram, registry=registry)

    engines = {i: ["tiny", str(i)] for i, _ in payloads}
    prom = Prom(config, ["model_name", "engine"], engines)
    for engine_idx, payload in payloads:
        if payload is not None:
            prom.observe(payload.data, engine_idx)
    samples = {}
    for metric in registry.collect():
        for sample in metric.samples:
            if not sample.name.startswith(("vllm:kv_offload_strata_", "vllm:kv_offload_tiering_")):
                continue
            if sample.name.endswith("_created"):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()) if k != "model_name")
            samples[f"{sample.name}{{{labels}}}"] = sample.value
    return samples


def logged_metrics(config: Any, payloads: list[tuple[int, Any]]) -> str:
    """vLLM's "KV Transfer metrics" log line (`KVConnectorLogging`) over both engines' payloads."""
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorLogging

    logging = KVConnectorLogging(config.kv_transfer_config)
    for _engine_idx, payload in payloads:
        if payload is not None:
            logging.observe(payload.data)
    lines: list[str] = []
    logging.log(log_fn=lambda fmt, *args: lines.append(fmt % args))
    return "\n".join(lines)


def metrics(request: dict[str, Any]) -> dict[str, Any]:
    """Engine 0 stores the prompt's chunks in jobs of `store_jobs` chunks; engine 1, a real v1 Scheduler with the
    OffloadingConnector, schedules the prompt (promoting what the tier holds). The stats payloads are what vLLM's
    scheduler sends its frontend: the manager's `get_stats()` after each store job (engine 0 has no connector
    around it) and the connector's `get_kv_connector_stats()` (engine 1)."""
    writer_config, _spec, writer = build_manager(request, "metrics-store")
    keys = prompt_keys(writer_config, request["prompt"])
    payloads = [(0, payload) for payload in store_in_jobs(writer, keys, request["store_jobs"])]
    writer_stats = strata_tier(writer).stats()
    chunk_bytes = int(primary_bytes(writer).shape[1])
    close(writer)

    config = vllm_config(request, f"metrics-load-{next(_ENGINES)}")
    model = json.loads(Path(request["model_dir"], "config.json").read_text())
    scheduler = Scheduler(config, kv_cache_config(model), StructuredOutputManager(config), GPU_BLOCK_TOKENS)
    _OPEN.append(scheduler)
    req = prompt_request(config, "prompt-1", request["prompt"])
    scheduler.add_request(req)
    for _ in range(request.get("steps", 2000)):
        out = scheduler.schedule()
        if out.kv_connector_metadata.load_jobs or out.num_scheduled_tokens.get(req.request_id, 0):
            break
        time.sleep(0.01)
    manager = scheduler.connector.connector_scheduler.manager
    tier = strata_tier(manager)
    tier.drain_jobs()
    step(manager)  # collects the finished load jobs
    payloads.append((1, scheduler.connector.get_kv_connector_stats()))
    reader_stats = tier.stats()
    close(scheduler)
    return {
        "chunk_bytes": chunk_bytes,
        "keys": len(keys),
        "writer_stats": writer_stats,
        "reader_stats": reader_stats,
        "prometheus": prometheus_samples(config, payloads),
        "log": logged_metrics(config, payloads),
    }


def decode_events(request: dict[str, Any]) -> dict[str, Any]:
    """Decode published messages with vLLM's own `KVEventBatch` decoder, as vLLM's subscribers do, and say which
    hash vLLM itself publishes for each offload key (`maybe_convert_block_hash` of the key's block hash) and which
    media vLLM names."""
    import msgspec
    from vllm.distributed.kv_events import MEDIUM_CPU, MEDIUM_GPU, MEDIUM_STORAGE, KVEventBatch
    from vllm.v1.core.kv_cache_utils import maybe_convert_block_hash

    decoder = msgspec.msgpack.Decoder(type=KVEventBatch)
    batches = []
    for topic, seq, payload in request["frames"]:
        batch = decoder.decode(bytes.fromhex(payload))
        events = [{"type": type(e).__name__, **msgspec.to_builtins(e)} for e in batch.events]
        batches.append(
            {
                "topic": bytes.fromhex(topic).decode(),
                "seq": int.from_bytes(bytes.fromhex(seq), "big"),
                "ts": batch.ts,
                "data_parallel_rank": batch.data_parallel_rank,
                "events": events,
            }
        )
    expected = [maybe_convert_block_hash(bytes.fromhex(k)[:-4]) for k in request.get("offload_keys", [])]
    return {"batches": batches, "vllm_hashes": expected, "media": [MEDIUM_GPU, MEDIUM_CPU, MEDIUM_STORAGE]}


def main() -> None:
    """Answer one JSON request per stdin line until stdin closes (vLLM is imported once for all of them)."""
    modes = {
        "store": store,
        "load": load,
        "lookup": lookup,
        "schedule": schedule,
        "bench": bench,
        "metrics": metrics,
        "decode_events": decode_events,
    }
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            model = request.get("model", MODEL_CONFIG)
            # `model_path`: where the model is "mounted" (the webhook's revision path), relative to the workdir.
            model_path = Path(request["workdir"]) / request.get("model_path", "model")
            request["model_dir"] = str(write_model_dir(model_path, model))
            result = modes[request["mode"]](request)
        except Exception:
            result = {"error": traceback.format_exc()}
            while _OPEN:
                with contextlib.suppress(Exception):
                    close(_OPEN[-1])
        print(RESULT_MARK + json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
