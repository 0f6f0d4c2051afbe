"""Prometheus metrics and the /healthz, /readyz endpoints, on their own port (aiohttp).

Tier counters are read from the store at scrape time (a custom collector), so the hot path only
bumps plain integers; command latency goes into a histogram.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from ..store.offload_stats import metric_families as offload_metric_families

if TYPE_CHECKING:
    from .state import ServerState

LATENCY_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1,
    2.5,
    10,
)


class _StoreCollector(Collector):
    def __init__(self, state: ServerState) -> None:
        self.state = state

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        st = self.state.store.stats()
        hits = CounterMetricFamily("strata_kv_hits", "GETs answered, by tier", labels=["tier"])
        for tier in ("l1", "fs", "s3"):
            hits.add_metric([tier], st[f"hits_{tier}"])
        yield hits
        yield CounterMetricFamily("strata_kv_misses", "GETs answered with a miss", value=st["misses"])
        yield CounterMetricFamily("strata_kv_sets", "Chunks stored", value=st["sets"])
        yield CounterMetricFamily("strata_kv_set_bytes", "Bytes of chunks stored", value=st["bytes_in"])
        yield CounterMetricFamily("strata_kv_promotions", "L2 hits copied into L1", value=st["promotions"])
        used = GaugeMetricFamily("strata_kv_used_bytes", "Bytes held, by tier", labels=["tier"])
        cap = GaugeMetricFamily("strata_kv_capacity_bytes", "Capacity, by tier", labels=["tier"])
        evictions = CounterMetricFamily("strata_kv_evictions", "Chunks evicted, by tier", labels=["tier"])
        used.add_metric(["l1"], st["l1_used_bytes"])
        cap.add_metric(["l1"], st["l1_capacity_bytes"])
        evictions.add_metric(["l1"], st["l1_evictions"])
        yield GaugeMetricFamily(
            "strata_kv_l1_new_chunk_share_bytes",
            "Bytes of L1 the eviction policy keeps for chunks not yet read twice; prefix-lirs moves it by itself: "
            "up as newly stored chunks are needed again, down as protected ones are",
            value=st["l1_new_chunk_share_bytes"],
        )
        if "fs_used_bytes" in st:
            used.add_metric(["fs"], st["fs_used_bytes"])
            cap.add_metric(["fs"], st["fs_capacity_bytes"])
            evictions.add_metric(["fs"], st["fs_evictions"])
            yield CounterMetricFamily(
                "strata_kv_corrupt_blocks_removed",
                "Corrupt L2 block files removed",
                value=st["fs_corrupt_removed"],
            )
            yield CounterMetricFamily(
                "strata_kv_fs_namespaces_refused",
                "L2 fs writes refused: their vLLM namespace directory would pass l2.fs.max_namespaces",
                value=st["fs_namespaces_refused"],
            )
            yield CounterMetricFamily(
                "strata_kv_fs_vllm_blocks_served",
                "L2 fs reads served from block files a vLLM fs tier wrote (no Strata trailer)",
                value=st["fs_foreign_served"],
            )
        yield used
        yield cap
        yield evictions
        yield GaugeMetricFamily("strata_kv_l1_keys", "Chunks resident in L1", value=st["l1_keys"])
        store = self.state.store
        store.offload.sweep(store.l1.__contains__, len(store.l1), force=True)
        yield from offload_metric_families(self.state.store.offload)
        if "write_behind_depth" in st:
            yield GaugeMetricFamily("strata_kv_write_behind_depth", "Chunks waiting for L2", st["write_behind_depth"])
            yield GaugeMetricFamily("strata_kv_write_behind_bytes", "Bytes waiting for L2", st["write_behind_bytes"])
            errors = CounterMetricFamily("strata_kv_l2_write_errors", "Failed L2 writes", labels=["tier"])
            for tier in ("fs", "s3"):
                if f"{tier}_write_errors" in st:
                    errors.add_metric([tier], st[f"{tier}_write_errors"])
            yield errors
            failing = GaugeMetricFamily(
                "strata_kv_l2_failing", "1 while the tier's latest L2 write failed (e.g. disk full)", labels=["tier"]
            )
            for tier in ("fs", "s3"):
                if f"{tier}_write_failing" in st:
                    failing.add_metric([tier], st[f"{tier}_write_failing"])
            yield failing
        yield GaugeMetricFamily("strata_kv_connected_clients", "Open client connections", len(self.state.sessions))
        rejected = self.state.rejected_connections
        yield CounterMetricFamily("strata_kv_rejected_connections", "Connections refused: no slot free", value=rejected)
        closed = CounterMetricFamily(
            "strata_kv_client_disconnections", "Connections the server closed, by reason", labels=["reason"]
        )
        for reason, n in sorted(self.state.disconnections.items()):
            closed.add_metric([reason], n)
        yield closed
        yield CounterMetricFamily("strata_kv_commands", "Commands processed", value=self.state.commands_processed)
        yield CounterMetricFamily(
            "strata_kv_values_refused",
            "Large values dropped: no memory could be mapped for them (the command got -OOM)",
            value=self.state.values_refused,
        )
        if (exports := self.state.exports) is not None:
            yield from _shared_memory(exports)
        if "events_queued" in st:
            queued = st["events_queued"]
            yield CounterMetricFamily("strata_kv_events_queued", "KV events queued to publish", value=queued)
            yield CounterMetricFamily(
                "strata_kv_events_published", "KV events handed to the ZMQ PUB socket", value=st["events_published"]
            )
            yield CounterMetricFamily(
                "strata_kv_events_dropped",
                "KV events dropped: queue full (events.queue_max) or send failed",
                value=st["events_dropped"],
            )
            yield GaugeMetricFamily("strata_kv_events_queue_depth", "KV events waiting", st["events_queue_depth"])


def _shared_memory(exports: Any) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
    """Values handed over as memory that clients may still hold (`exports.ExportLedger`), and its budgets."""
    yield GaugeMetricFamily(
        "strata_kv_shared_memory_bytes",
        "Bytes of values handed over as memory that clients may still hold",
        exports.bytes,
    )
    yield GaugeMetricFamily(
        "strata_kv_shared_memory_values", "Values handed over that clients may still hold", exports.values
    )
    held = max(exports.client_bytes.values(), default=0)
    yield GaugeMetricFamily("strata_kv_shared_memory_client_max_bytes", "The most one open connection holds", held)
    budget = GaugeMetricFamily(
        "strata_kv_shared_memory_budget_bytes", "Budgets of handed-over memory", labels=["scope"]
    )
    budget.add_metric(["server"], exports.server_budget)
    budget.add_metric(["client"], exports.client_budget)
    yield budget
    over = CounterMetricFamily(
        "strata_kv_shared_memory_over_budget",
        "STRATA.GETFD answered with the bytes because a budget was full, by budget",
        labels=["scope"],
    )
    for scope in ("client", "server"):
        over.add_metric([scope], exports.over_budget[scope])
    yield over


class Metrics:
    """Owns one registry per server (tests run several servers in one process)."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.registry = CollectorRegistry()
        self.registry.register(_StoreCollector(state))
        self.latency = Histogram(
            "strata_kv_command_seconds",
            "Command latency from parse to reply queued",
            ["command"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self._by_command: dict[bytes, Any] = {}
        self._runner: web.AppRunner | None = None
        self.port = 0

    def observe(self, command: bytes, seconds: float) -> None:
        child = self._by_command.get(command)
        if child is None:
            from .commands import COMMANDS

            name = command.upper()
            label = name.decode() if name in COMMANDS else "OTHER"  # bounded label set
            child = self._by_command[command] = self.latency.labels(label)
            if len(self._by_command) > 4096:
                self._by_command.clear()
        child.observe(seconds)

    async def start(self, bind: str, port: int) -> None:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/healthz", self._healthz)
        app.router.add_get("/readyz", self._readyz)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, bind, port, reuse_address=True)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        self.port = sockets[0].getsockname()[1] if sockets else port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _metrics(self, request: web.Request) -> web.Response:
        body = generate_latest(self.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def _readyz(self, request: web.Request) -> web.Response:
        if self.state.store.ready:
            failing = self.state.store.failing_l2_tiers()
            if failing:  # L1 still serves: stay ready, but say so
                return web.Response(text=f"ready; L2 writes failing: {','.join(failing)}\n")
            return web.Response(text="ready\n")
        return web.Response(status=503, text="not ready: store starting or shutting down\n")
