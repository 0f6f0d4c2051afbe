"""The large-value bench's report (`bench/kv_large.py --report`): runs merged into medians, and each cell's ratio
next to the range of the runs' own ratios, which pair the two servers under one machine state."""

from __future__ import annotations

from typing import Any

from strata_testsupport.kvserver import kv_large_bench


def cell(server: str, gbps: float) -> dict[str, Any]:
    return {"server": server, "transport": "tcp", "op": "SET", "size_mib": 4, "clients": 1, "gbps": gbps,
            "p50_ms": 1.0, "p99_ms": 2.0, "peak_rss": 1, "probe_p99_ms": float("nan")}  # fmt: skip


def run(strata: float, redis: float, store: float | None = None) -> dict[str, Any]:
    return {
        "machine": {},
        "memcpy_gbps": 10.0,
        "client_ceiling": [],
        "store_ceiling": [] if store is None else [cell("store", store)],
        "cells": [cell("strata", strata), cell("redis", redis)],
    }


def test_merged_runs_show_the_ratio_of_medians_and_the_range_of_each_runs_ratio() -> None:
    bench = kv_large_bench()
    # The medians say 1.20x; run by run Strata was behind in one run and ahead in two.
    merged = bench.merge_runs([run(2.0, 2.5), run(3.0, 2.0), run(4.0, 3.0)])
    row = bench.table(merged["cells"], "tcp").splitlines()[2]
    assert "| 3.00 (2.00-4.00) | 2.50 (2.00-3.00) | 1.20x (0.80-1.50) |" in row


def test_a_single_run_has_no_range() -> None:
    bench = kv_large_bench()
    row = bench.table(bench.merge_runs([run(3.0, 2.0)])["cells"], "tcp").splitlines()[2]
    assert "| 3.00 | 2.00 | 1.50x |" in row


def test_the_store_ceiling_shows_how_far_over_redis_any_store_got_in_each_run() -> None:
    bench = kv_large_bench()
    merged = bench.merge_runs([run(2.0, 2.5, 2.6), run(3.0, 2.0, 2.2), run(4.0, 3.0, 3.3)])
    head, _, row = bench.table(merged["cells"], "tcp", merged["client_ceiling"], merged["store_ceiling"]).splitlines()
    assert "| store ceiling GB/s (over Redis) |" in head
    assert "| 1.20x (0.80-1.50) | 2.60 (2.20-3.30) (1.04x (1.04-1.10)) |" in row


def test_interleaved_rounds_give_each_servers_ratio_over_redis_round_by_round() -> None:
    bench = kv_large_bench()
    rounds = []
    for n, (strata, redis, store) in enumerate([(2.0, 1.0, 2.2), (1.0, 1.0, 1.1), (3.0, 2.0, 2.0)]):
        for server, gbps in (("strata", strata), ("redis", redis), ("store", store)):
            rounds.append(cell(server, gbps) | {"round": n, "cpu_ms_per_gb": 100.0 * n})
    lines = bench.interleaved_table(rounds).splitlines()
    # Per round Strata was 2.0x, 1.0x and 1.5x Redis: the median round is 1.5x, where the medians of GB/s
    # (2.0 over 1.0) would say 2.0x.
    assert "| 4 MiB | SET | 1 | strata | 2.00 | 1.50x (1.00-2.00) | 100 | - |" in lines
    assert "| 4 MiB | SET | 1 | store | 2.00 | 1.10x (1.00-2.20) | 100 | - |" in lines
