"""Shared worker threads and a fail-fast wait: kept free of torch so the CLI starts quickly."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait

DEFAULT_CONCURRENCY = 4
"""Reads in flight for local files: on few cores, where page faults dominate, more threads only contend."""
S3_CONCURRENCY = 16
"""Ranged GETs in flight for S3: latency-bound, so many more."""


def concurrency_for(locations: Sequence[object], requested: int | None) -> int:
    if requested is not None:
        return requested
    remote = any(str(loc).startswith("s3://") for loc in locations)
    return S3_CONCURRENCY if remote else DEFAULT_CONCURRENCY


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def thread_pool(concurrency: int) -> ThreadPoolExecutor:
    """One shared pool per concurrency level: threads are reused across calls."""
    with _pools_lock:
        pool = _pools.get(concurrency)
        if pool is None:
            pool = _pools[concurrency] = ThreadPoolExecutor(concurrency, thread_name_prefix="strata-read")
        return pool


def finish(futures: Sequence[Future[None]]) -> None:
    """Wait for all; on the first failure, cancel the rest, let running reads end, then re-raise."""
    try:
        for f in futures:
            f.result()
    except BaseException:
        for f in futures:
            f.cancel()
        wait(futures)
        raise
