"""Strata's secondary tier for vLLM's OffloadingConnector (`TieringOffloadingSpec`, vLLM 0.33).

vLLM loads it by name from its `--kv-transfer-config`::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": ..., "secondary_tiers": [
            {"type": "StrataTier", "module_path": "strata_kv.vllm_tier", "url": "redis://<node-local Service>:6379"}]}}

and every vLLM instance on a node then shares that node's `strata-kv` server (its DRAM tier and the L2 behind it)
without privileges. Chunks move between the CPU primary tier's memory (`primary_kv_view`, a /dev/shm mapping) and
the server on a few I/O threads; vLLM's scheduler thread only queues work and collects results.

Keys: vLLM's offload key (block hash + 4-byte big-endian KV group) behind the namespace vLLM's own `FileMapper`
derives from the model and KV layout (`<model>_<digest12>_r<rank>/`), so instances of one model and layout hit each
other's chunks and different models or layouts never do (block hashes alone do not name the model). The
server's L2 files each chunk where vLLM's own `fs` tier files that block (`strata_kv.store.blockfile.locate`), so an
engine running vLLM's `fs` tier on the server's L2 directory shares these chunks too.

Failure: every server call is bounded by a timeout and a circuit breaker (`strata_kv.vllm.engine_link`). A lookup that
fails is a miss, a store that fails or finds the store queue full is dropped, a load that fails makes vLLM
recompute those blocks; each is counted in `stats()`. No request waits on a dead server for more than one timeout.

Metrics: `build_metric_definitions`/`get_stats` put those counters into vLLM's own metrics (Prometheus
`vllm:kv_offload_strata_*` on the frontend's /metrics and the "KV Transfer metrics" log line), as vLLM's tiers do.

Imports: vLLM, the standard library and `strata_kv.vllm.engine_link`/`strata_kv.client` (stdlib only), nothing of the
server's dependencies.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, ClassVar

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import OffloadingConnectorStats
from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadingCounterMetadata,
    OffloadingEvent,
    OffloadingGaugeMetadata,
    OffloadingMetricMetadata,
    OffloadKey,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.file_mapper import FileMapper
from vllm.v1.kv_offload.tiering.async_lookup import AsyncLookupManager
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob

from ..client import KVClient, KVError
from .engine_link import CircuitBreaker, Endpoint, EngineLink, ServerUnavailable, token_from_env

log = logging.getLogger(__name__)

DEFAULT_URL = "redis://127.0.0.1:6379"
DEFAULT_TOKEN_ENV = "STRATA_KV_TOKEN"


def namespace_prefix(offloading_spec: Any) -> bytes:
    """`<model>_<digest12>_r<rank>/`: the directory vLLM's `fs` tier would use for this model and layout.

    Computed by vLLM's own FileMapper with the `fs` tier's arguments, so the digest follows vLLM whenever it
    changes what makes two layouts compatible.
    """
    mapper = FileMapper.from_offloading_spec(
        root_dir="",
        offloading_spec=offloading_spec,
        blocks_per_file=offloading_spec.blocks_per_chunk,
        parallel_agnostic=True,
    )
    return f"{mapper.base_path.lstrip('/')}_r{mapper.rank}/".encode()


class _StrataLookups(AsyncLookupManager):
    """vLLM's async lookup bookkeeping; the probe is one STRATA.PREFIX per KV group, per request, per step."""

    def __init__(self, tier: StrataTier) -> None:
        self._tier = tier
        super().__init__(tier_type=tier.tier_type)

    def batch_lookup(self, keys: list[OffloadKey], req_context: ReqContext) -> Iterable[bool]:
        return self._tier._probe(keys)


class StrataTier(SecondaryTierManager):
    """A node's `strata-kv` server as a secondary tier: lookups, stores and loads over RESP, off the scheduler."""

    medium: ClassVar[Medium] = Medium.STORAGE

    def __init__(
        self,
        offloading_spec: Any,
        primary_kv_view: memoryview,
        tier_type: str,
        url: str = DEFAULT_URL,
        unix_socket: str | None = None,
        token_env: str | None = DEFAULT_TOKEN_ENV,
        io_threads: int = 4,
        timeout_s: float = 5.0,
        lookup_timeout_s: float = 1.0,
        connect_timeout_s: float = 1.0,
        failure_threshold: int = 3,
        reset_after_s: float = 5.0,
        max_pending_store_bytes: int = 1024**3,
        enable_kv_events: bool = False,
        locality: str | None = None,
        backpressure_detector: Any = None,
    ) -> None:
        """Args beyond vLLM's (every one has a default; the operator renders `url` and `token_env`):

        url: the node-local Service, `redis://host:port` (or `unix:///path`).
        unix_socket: a server socket mounted into the pod; used instead of `url` when it exists at start.
        token_env: environment variable holding the AUTH token (unset or empty: no AUTH).
        io_threads: threads moving chunks; each holds at most one connection.
        timeout_s: bound on one chunk's send or receive; lookup_timeout_s: on one lookup (the scheduler retries
            a pending lookup every step, so a slow answer delays the request by at most this).
        failure_threshold / reset_after_s: failures in a row that open the breaker, and the pause before a probe.
        max_pending_store_bytes: chunk bytes queued for storing; a store past it is dropped (vLLM keeps the chunk
            in its CPU tier either way), so a slow server cannot pin the primary tier.
        enable_kv_events: report stores (and chunks found gone at load) as KV events, medium STORAGE, when vLLM's
            KV events are on.
        """
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        if io_threads < 1:
            raise ValueError(f"StrataTier io_threads must be at least 1, got {io_threads}")
        if max_pending_store_bytes < 0:
            raise ValueError(f"StrataTier max_pending_store_bytes must be 0 or more, got {max_pending_store_bytes}")
        self.locality = Locality(locality) if locality is not None else None
        endpoint = Endpoint(unix_socket=unix_socket) if unix_socket and os.path.exists(unix_socket) else None
        self.endpoint = endpoint or Endpoint.parse(url)
        token = token_from_env(token_env)
        breaker = CircuitBreaker(failure_threshold, reset_after_s)
        self._link = EngineLink(
            self.endpoint,
            token=token,
            timeout_s=timeout_s,
            connect_timeout_s=connect_timeout_s,
            max_idle=io_threads,
            breaker=breaker,
        )
        self._lookup_link = EngineLink(
            self.endpoint, token=token, timeout_s=lookup_timeout_s, connect_timeout_s=connect_timeout_s, breaker=breaker
        )
        self.namespace = namespace_prefix(offloading_spec)
        self._flat = primary_kv_view.cast("B")
        self._max_pending_store_bytes = max_pending_store_bytes
        self._pending_store_bytes = 0
        self._pending_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(io_threads, thread_name_prefix="strata_kv_tier")
        self._futures: set[Future[None]] = set()
        self._finished: queue.SimpleQueue[tuple[JobResult, list[OffloadKey] | None]] = queue.SimpleQueue()
        self._store_keys: dict[int, list[OffloadKey]] = {}
        self._counts: Counter[str] = Counter()
        self._counts_lock = threading.Lock()
        self._reported: dict[str, int] = {}
        self.events: list[OffloadingEvent] | None = None
        if enable_kv_events and offloading_spec.kv_events_config.enable_kv_cache_events:
            self.events = []
        self._lookups = _StrataLookups(self)
        log.info("Strata KV tier: server %s, namespace %s", self.endpoint, self.namespace.decode())

    # -- keys and counters ----------------------------------------------------------------------------
    def server_key(self, key: OffloadKey) -> bytes:
        return self.namespace + bytes(key)

    def _count(self, **amounts: int) -> None:
        with self._counts_lock:
            self._counts.update(amounts)

    def stats(self) -> dict[str, int]:
        """Counters since start: lookups, hits, chunks and bytes stored and loaded, drops and failures."""
        with self._counts_lock:
            counts = dict(self._counts)
        counts["breaker_opens"] = self._link.breaker.opens
        counts["connects"] = self._link.connects + self._lookup_link.connects
        counts["stale_connections"] = self._link.stale_connections + self._lookup_link.stale_connections
        return counts

    def _chunk(self, chunk_id: int) -> memoryview:
        """One chunk of the primary tier. Callers release it (`with`): vLLM unmaps the tier at shutdown, and a
        view still exported would make that fail (`BufferError: cannot close exported pointers exist`)."""
        size = self.block_size_bytes
        return self._flat[chunk_id * size : (chunk_id + 1) * size]

    # -- lookups --------------------------------------------------------------------------------------
    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        found = self._lookups.lookup(key, req_context)
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def _probe(self, keys: list[OffloadKey]) -> list[bool]:
        """Which keys the server holds (lookup thread). Keys come in the request's order; per KV group, the
        server answers how many lead the chain (and pins those in its DRAM for its EXISTS grace period)."""
        by_group: dict[bytes, list[int]] = {}
        for i, key in enumerate(keys):
            by_group.setdefault(bytes(key[-4:]), []).append(i)
        found = [False] * len(keys)
        try:
            for positions in by_group.values():
                args = [self.server_key(keys[i]) for i in positions]

                def prefix(client: KVClient, args: list[bytes] = args) -> Any:
                    return client.call("STRATA.PREFIX", *args)

                leading, _tiers = self._lookup_link.call(prefix)
                for i in positions[: int(leading)]:
                    found[i] = True
        except (OSError, ValueError, KVError) as e:
            self._count(lookup_errors=len(keys))
            if not isinstance(e, ServerUnavailable):
                log.warning("Strata KV tier: lookup of %d chunks failed (%s): counted as misses", len(keys), e)
            return [False] * len(keys)
        self._count(lookups=len(keys), lookup_hits=sum(found))
        return found

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._lookups.flush()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._lookups.cleanup(req_context.req_id)

    # -- transfers ------------------------------------------------------------------------------------
    def _submit(self, job_id: int, task: Any) -> None:
        future: Future[None] = self._pool.submit(task)
        self._futures.add(future)
        future.add_done_callback(self._futures.discard)

    def submit_store(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        chunk_ids = [int(c) for c in job_metadata.chunk_ids]
        job_id = job_metadata.job_id
        nbytes = len(keys) * self.block_size_bytes
        with self._pending_lock:
            reachable = self._link.breaker.would_allow()
            admitted = reachable and (
                self._pending_store_bytes + nbytes <= self._max_pending_store_bytes or self._pending_store_bytes == 0
            )
            if admitted:
                self._pending_store_bytes += nbytes
        if not admitted:
            dropped = "stores_dropped_unavailable" if not reachable else "stores_dropped_queue_full"
            self._count(store_jobs=1, stores_dropped=len(keys), **{dropped: len(keys)})
            self._finished.put((JobResult(job_id, success=False, transfer_bytes=0), None))
            return
        if self.events is not None:
            self._store_keys[job_id] = keys

        def store() -> None:
            start, done = time.monotonic(), 0
            items = [
                (self.server_key(key), self._chunk(chunk_id)) for key, chunk_id in zip(keys, chunk_ids, strict=True)
            ]
            try:
                # The job's SETs at once (`set_many_from`): one send and one receive per job, not two per chunk.
                stored, error = self._link.call(lambda client: client.set_many_from(items))
                done = sum(stored)
                if error is not None:
                    self._count(stores_failed=len(keys) - done)
                    log.warning("Strata KV tier: %d of %d chunks not stored: %s", len(keys) - done, len(keys), error)
            except (OSError, ValueError, KVError) as e:
                self._count(stores_failed=len(keys) - done)
                if not isinstance(e, ServerUnavailable):
                    log.warning("Strata KV tier: store of %d chunks stopped after %d: %s", len(keys), done, e)
            finally:
                for _, view in items:
                    view.release()
                with self._pending_lock:
                    self._pending_store_bytes -= nbytes
            size = done * self.block_size_bytes
            self._count(store_jobs=1, chunks_stored=done, bytes_stored=size)
            result = JobResult(job_id, done == len(keys), None, time.monotonic() - start, size)
            self._finished.put((result, None))

        self._submit(job_id, store)

    def submit_load(self, job_metadata: TransferJob) -> None:
        keys = list(job_metadata.keys)
        chunk_ids = [int(c) for c in job_metadata.chunk_ids]
        job_id = job_metadata.job_id

        def load() -> None:
            start, done = time.monotonic(), 0
            server_keys = [self.server_key(key) for key in keys]
            views = [self._chunk(chunk_id) for chunk_id in chunk_ids]
            try:
                # The job's chunks in one sized MGET (`get_many_into`): three returns to the GIL per job, not four
                # per chunk.
                found, error = self._link.call(lambda client: client.get_many_into(server_keys, views))
                done = found.index(False) if False in found else len(found)
                if error is not None:
                    log.warning("Strata KV tier: load of %d chunks stopped after %d: %s", len(keys), done, error)
                elif done < len(keys):
                    self._count(loads_missing=1)
            except (OSError, ValueError, KVError) as e:
                if not isinstance(e, ServerUnavailable):
                    log.warning("Strata KV tier: load of %d chunks stopped after %d: %s", len(keys), done, e)
            finally:
                for view in views:
                    view.release()
            size = done * self.block_size_bytes
            self._count(load_jobs=1, chunks_loaded=done, bytes_loaded=size, loads_failed=len(keys) - done)
            ok = done == len(keys)
            successful = None if ok else tuple(keys[:done]) or None
            result = JobResult(job_id, ok, successful, time.monotonic() - start, size)
            self._finished.put((result, None if ok else keys[done:]))

        self._submit(job_id, load)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        results = []
        while True:
            try:
                result, missed = self._finished.get_nowait()
            except queue.Empty:
                break
            if missed:
                # The server no longer holds these: stop vLLM from re-issuing the doomed load (vLLM #49176).
                self._lookups.mark_miss(missed)
                if self.events is not None:
                    self.events.append(OffloadingEvent(list(missed), self.medium, True, self.locality))
            keys = self._store_keys.pop(result.job_id, None)
            if self.events is not None and keys and result.success:
                self.events.append(OffloadingEvent(keys, self.medium, False, self.locality))
            results.append(result)
        return results

    def has_pending_work(self) -> bool:
        return bool(self._futures) or not self._finished.empty()

    def take_events(self) -> Iterable[OffloadingEvent]:
        if self.events:
            events, self.events = self.events, []
            yield from events

    def drain_jobs(self) -> None:
        """Wait for every submitted transfer; each is bounded by the socket timeout, so this ends."""
        wait(list(self._futures))

    def shutdown(self) -> None:
        self._lookups.shutdown()
        self._pool.shutdown(wait=True)
        self._flat.release()  # the last view of vLLM's mapping this tier holds: vLLM unmaps it next
        self._link.close()
        self._lookup_link.close()
        log.info("Strata KV tier: shut down, %s", self.stats())

    @classmethod
    def config_info_keys(cls, tier_config: dict[str, Any]) -> tuple[str, ...]:
        return ("kv_server",)

    def config_info(self) -> dict[str, str]:
        return {"kv_server": str(self.endpoint)}

    # -- vLLM's metrics -------------------------------------------------------------------------------
    @classmethod
    def build_metric_definitions(cls, extra_config: dict[str, Any]) -> dict[str, OffloadingMetricMetadata]:
        """The series `get_stats()` feeds (vLLM's frontend registers exactly these, with its model and engine
        labels, and rejects a payload naming any other). Always on: one dict of deltas per scheduler step."""
        metrics: dict[str, OffloadingMetricMetadata] = {
            METRIC_PREFIX + name: OffloadingCounterMetadata(documentation=doc, labelnames=labels)
            for name, (doc, labels) in _COUNTERS.items()
        }
        metrics[METRIC_PREFIX + "pending_store_bytes"] = OffloadingGaugeMetadata(
            documentation="Chunk bytes queued for storing into the strata-kv server (max_pending_store_bytes caps it)."
        )
        return metrics

    def get_stats(self) -> OffloadingConnectorStats | None:
        """What the counters of `stats()` gained since the last call, as vLLM's metric payload.

        vLLM's scheduler takes this through the TieringOffloadingManager every step and sends it to the frontend,
        which adds it to the Prometheus series of `build_metric_definitions` and to its periodic "KV Transfer
        metrics" log line, next to what vLLM itself counts per tier (`kv_offload_tiering_*`, tier `<n>:StrataTier`).
        `stats()` keeps the totals. Called from the scheduler thread only (under the manager's lock)."""
        counts = self.stats()
        counts["lookup_misses"] = counts.get("lookups", 0) - counts.get("lookup_hits", 0)
        stats = OffloadingConnectorStats()
        for key, metric, labelvalues in _REPORTED:
            delta = counts.get(key, 0) - self._reported.get(key, 0)
            if delta:
                stats.increase_counter(METRIC_PREFIX + metric, delta, labelvalues)
                self._reported[key] = counts.get(key, 0)
        with self._pending_lock:
            pending = self._pending_store_bytes
        stats.set_gauge(METRIC_PREFIX + "pending_store_bytes", pending)
        return stats


METRIC_PREFIX = "vllm:kv_offload_strata_"
"""Next to vLLM's own `vllm:kv_offload_*` series; Prometheus shows counters with a `_total` suffix."""

_COUNTERS: dict[str, tuple[str, tuple[str, ...]]] = {
    "store_bytes": ("Chunk bytes stored into the strata-kv server.", ()),
    "load_bytes": ("Chunk bytes loaded from the strata-kv server into the CPU tier.", ()),
    "store_chunks": ("Chunks stored into the strata-kv server.", ()),
    "load_chunks": ("Chunks loaded from the strata-kv server.", ()),
    "store_jobs": ("Store jobs vLLM handed to the Strata tier, dropped ones included.", ()),
    "load_jobs": ("Load jobs vLLM handed to the Strata tier.", ()),
    "lookup_chunks": (
        "Chunks the Strata tier looked up on the server, by result: hit, miss, or error (server down or slow: "
        "a miss for vLLM).",
        ("result",),
    ),
    "stores_dropped_chunks": (
        "Chunks not stored, by reason: unavailable (the circuit breaker is open: server down or stalled) or "
        "queue_full (max_pending_store_bytes reached: server slower than vLLM offloads). vLLM keeps them in its "
        "CPU tier.",
        ("reason",),
    ),
    "store_failed_chunks": ("Chunks whose store was tried and failed (error or timeout).", ()),
    "load_failed_chunks": ("Chunks a load job did not bring back (vLLM recomputes them).", ()),
    "load_missing_chunks": ("Loads that found a chunk gone from the server (evicted since the lookup).", ()),
    "breaker_opens": ("Times the circuit breaker to the strata-kv server opened.", ()),
    "connects": ("Connections opened to the strata-kv server.", ()),
    "stale_connections": (
        "Pooled connections the strata-kv server had closed while they sat idle (its idle timeout, a restart); "
        "the call ran again on a new one.",
        (),
    ),
}

_REPORTED: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    # stats() key, metric (after METRIC_PREFIX), label values
    ("bytes_stored", "store_bytes", ()),
    ("bytes_loaded", "load_bytes", ()),
    ("chunks_stored", "store_chunks", ()),
    ("chunks_loaded", "load_chunks", ()),
    ("store_jobs", "store_jobs", ()),
    ("load_jobs", "load_jobs", ()),
    ("lookup_hits", "lookup_chunks", ("hit",)),
    ("lookup_misses", "lookup_chunks", ("miss",)),
    ("lookup_errors", "lookup_chunks", ("error",)),
    ("stores_dropped_unavailable", "stores_dropped_chunks", ("unavailable",)),
    ("stores_dropped_queue_full", "stores_dropped_chunks", ("queue_full",)),
    ("stores_failed", "store_failed_chunks", ()),
    ("loads_failed", "load_failed_chunks", ()),
    ("loads_missing", "load_missing_chunks", ()),
    ("breaker_opens", "breaker_opens", ()),
    ("connects", "connects", ()),
    ("stale_connections", "stale_connections", ()),
)
