"""Scrape every ready server's /metrics (bounded concurrency, short timeouts) into status.usage.

Runs from the drift timer, not on every event: counters move all the time, and a status write per
scrape interval is the price of showing them.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

from strata_operator.handlers.kvcachetier import io as io
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


def scrape_all(hosts: Iterable[str], port: int, deadline: float = SCRAPE_DEADLINE_SECONDS) -> list[ServerUsage | None]:
    """Every host's usage in order, None for those that failed or missed the deadline."""
    hosts = list(hosts)
    if not hosts:
        return []
    pool = ThreadPoolExecutor(max_workers=min(SCRAPE_CONCURRENCY, len(hosts)))
    futures = [pool.submit(scrape, host, port) for host in hosts]
    wait(futures, timeout=deadline)
    pool.shutdown(wait=False, cancel_futures=True)
    return [f.result() if f.done() and not f.cancelled() else None for f in futures]


def refresh_usage(tier_body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Scrape the ready endpoints in status and write status.usage when it changed; returns it."""
    status = tier_body.get("status") or {}
    ready = [e for e in status.get("endpoints") or [] if e.get("ready") and e.get("address")]
    if not ready:
        return None
    port = int((tier_body.get("spec") or {}).get("metricsPort", 9121))
    results = scrape_all((e["address"].rsplit(":", 1)[0] for e in ready), port)
    usage = summarize((u for u in results if u is not None), instances=len(ready))
    if usage != status.get("usage"):
        meta = tier_body["metadata"]
        io.write_tier_status(meta["name"], meta["namespace"], {"usage": usage})
    return usage
