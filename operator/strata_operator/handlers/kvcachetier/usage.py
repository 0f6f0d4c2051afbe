"""Scrape every ready server's /metrics (bounded concurrency, short timeouts): a read of the tier's gather.

Only every `USAGE_INTERVAL_SECONDS` (the daemon decides), not on every event: counters move all the time, and a
status write per scrape interval is the price of showing them. The plan puts the result into status.usage.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.engines import parse_engine_metrics
from strata_operator.resources.kvcachetier.status import endpoints
from strata_operator.resources.kvcachetier.usage import ServerUsage, parse_metrics, summarize

SCRAPE_TIMEOUT_SECONDS = 2.0
SCRAPE_CONCURRENCY = 16
SCRAPE_DEADLINE_SECONDS = 10.0
"""All scrapes of one tier together: servers that have not answered by then count as unreachable, so
hundreds of unreachable pods cannot hold the timer for minutes."""


def scrape(host: str, port: int, timeout: float = SCRAPE_TIMEOUT_SECONDS) -> ServerUsage | None:
    """One server's usage, or None when it does not answer in time (it is counted as unreachable)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as response:
            return parse_metrics(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def scrape_engine(host: str, port: int, timeout: float = SCRAPE_TIMEOUT_SECONDS) -> dict[str, float] | None:
    """One engine's prefill sums from vLLM's /metrics, or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as response:
            return parse_engine_metrics(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def scrape_all(
    hosts: Iterable[str],
    port: int,
    deadline: float = SCRAPE_DEADLINE_SECONDS,
    read: Callable[[str, int], Any] = scrape,
) -> list[Any]:
    """`read(host, port)` of every host in order (a server's usage by default), None for those that failed or
    missed the deadline."""
    hosts = list(hosts)
    if not hosts:
        return []
    pool = ThreadPoolExecutor(max_workers=min(SCRAPE_CONCURRENCY, len(hosts)))
    futures = [pool.submit(read, host, port) for host in hosts]
    wait(futures, timeout=deadline)
    pool.shutdown(wait=False, cancel_futures=True)
    return [f.result() if f.done() and not f.cancelled() else None for f in futures]


def read_usage(pods: Sequence[Mapping[str, Any]], spec: KVCacheTierSpec) -> dict[str, Any] | None:
    """status.usage from the ready servers among `pods`: totals over those that answered; None when none is ready
    (the stored usage stays)."""
    servers = read_servers(pods, spec)
    if servers is None:
        return None
    return summarize((u for _, u in servers if u is not None), instances=len(servers))


def read_servers(
    pods: Sequence[Mapping[str, Any]], spec: KVCacheTierSpec
) -> list[tuple[str, ServerUsage | None]] | None:
    """Each ready server among `pods` as (`pod/restarts`, its metrics or None when it did not answer); None when
    none is ready. The identity changes when a server restarts: its counters start again from zero."""
    ready = [e for e in endpoints(pods, spec.port) if e.get("ready") and e.get("address")]
    if not ready:
        return None
    restarts = {
        pod.get("metadata", {}).get("name"): sum(
            int(c.get("restartCount") or 0) for c in pod.get("status", {}).get("containerStatuses") or []
        )
        for pod in pods
    }
    results = scrape_all((e["address"].rsplit(":", 1)[0] for e in ready), spec.metrics_port)
    return [(f"{e['pod']}/{restarts.get(e['pod'], 0)}", u) for e, u in zip(ready, results, strict=True)]


def _restarts(pod: Mapping[str, Any]) -> int:
    return sum(int(c.get("restartCount") or 0) for c in pod.get("status", {}).get("containerStatuses") or [])


def read_engines(consumers: Sequence[Mapping[str, Any]], port: int) -> list[tuple[str, dict[str, float] | None]]:
    """Each running, ready consumer pod as (`pod/restarts`, its vLLM prefill sums or None when it did not answer)."""
    ready = [
        pod
        for pod in consumers
        if pod.get("status", {}).get("podIP")
        and not pod.get("metadata", {}).get("deletionTimestamp")
        and any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod["status"].get("conditions") or [])
    ]
    results = scrape_all((p["status"]["podIP"] for p in ready), port, read=scrape_engine)
    return [(f"{p['metadata']['name']}/{_restarts(p)}", sums) for p, sums in zip(ready, results, strict=True)]
