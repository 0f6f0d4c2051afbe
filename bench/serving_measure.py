"""The serving-scale bench's points, run for real: per side, `vllm serve` engines on this CPU (vLLM's CPU venv) with
the connection ConfigMap of `vllm_cpu_sides`, a Strata server of its own where the side has one
(testsupport's `running_kv_server`), the users of `serving_client`, and the counters read before and after the
measured part: the engines' /metrics, and the server's /metrics judged by the operator's own offload verdict
(`offload_status`: `sample`, `advance` and `judge` over the point's deltas, with the engines' measured prefill
time per token)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
from gpu_vllm import (
    connection,
    free_port,
    get,
    reset_prefix_cache,
    serve_command,
    serve_env,
    start,
    stop,
    tail,
    wait_ready,
)
from offload_verdict import rfc3339
from serving_client import prime, run_users, single
from serving_workload import (
    Workload,
    engine_summary,
    kv_cache_lines,
    metric_delta,
    metric_sums,
    request_summary,
    request_timeline,
    rotated,
    users,
)
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.handlers.kvcachetier.io import scrape
from strata_operator.resources.kvcachetier.engines import parse_engine_metrics
from strata_operator.resources.kvcachetier.offload import offload_status, sample
from strata_testsupport.kvserver import KVServerProcess, running_kv_server
from vllm_cpu_sides import CHUNK_TOKENS, STORING_SIDES, engine_setup

SIDES: dict[str, tuple[str, int]] = {
    "none": ("none", 1),
    "cpu": ("cpu", 1),
    "vllm-fs": ("vllm-fs", 1),
    "strata-tcp": ("strata-tcp", 1),
    "strata-socket": ("strata-socket", 1),
    "strata-shm": ("strata-shm", 1),
    "cpu-x2": ("cpu", 2),
    "strata-tcp-x2": ("strata-tcp", 2),
}
"""Side → (its setup in `vllm_cpu_sides.engine_setup`, replicas behind round-robin)."""


@dataclass(frozen=True)
class Settings:
    model: Path
    vllm_python: str
    engine_blocks: int
    """vLLM's KV cache per engine, in blocks of 32 tokens (`--num-gpu-blocks-override`): small on purpose."""
    cpu_bytes: str
    """Each engine's CPU tier (connector.cpuBytes), the same for every side that has one."""
    kv_l1: str = "4GiB"
    max_model_len: int = 8192
    """The longest prompt and answer (vLLM refuses to start where its KV memory cannot hold one)."""
    start_timeout: float = 600.0
    prime_timeout: float = 3600.0
    """Priming sends every user's document at once: 64 users' took over 20 minutes on an AVX2 CPU."""
    min_lookups: int = 50


@dataclass
class Engines:
    urls: list[str]
    ports: list[int]
    server: KVServerProcess | None
    kv_cache: list[str]
    """vLLM's own lines on its KV cache (its size in tokens): the proof that the KV memory is what was asked."""
    pids: list[int]
    """The engines' API server processes (their engine cores and workers are their children)."""


CPU_SECONDS = {"engines": "bench:engines_cpu_seconds", "strata_server": "bench:strata_server_cpu_seconds"}
"""Pseudo-counters a scrape adds beside the engines' pages: CPU seconds of the engines' process trees and of the
Strata server. On two cores every second the tier's server spends is a second the engines do not get."""


def cpu_seconds(pids: Sequence[int]) -> float:
    """User and system CPU seconds so far of these processes and all their descendants."""
    total = 0.0
    for pid in pids:
        try:
            root = psutil.Process(pid)
            tree = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            continue
        for proc in tree:
            try:
                times = proc.cpu_times()
            except psutil.NoSuchProcess:
                continue
            total += times.user + times.system
    return total


@contextlib.contextmanager
def side_engines(side: str, settings: Settings, work: Path) -> Iterator[Engines]:
    """The side's engines, ready, and its Strata server where it has one; all stopped on the way out."""
    setup, replicas = SIDES[side]
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        server = None
        if setup.startswith("strata"):
            config: dict[str, Any] = {"l1": {"size": settings.kv_l1}}
            if setup == "strata-shm":  # the operator's nodeSocket.sharedMemory
                config["listen"] = {"shared_memory": True}
            server = stack.enter_context(running_kv_server(work / "kv", config, l2_fs=False))
        transfer, data = engine_setup(setup, server, work / "fs", settings.cpu_bytes)
        # No connector: the same ConfigMap still names the hash algorithm (its other settings stay out of env).
        data = data or connection(settings.cpu_bytes, CHUNK_TOKENS, "cpu")
        flags = argparse.Namespace(
            device="cpu",
            max_model_len=settings.max_model_len,
            gpu_memory_utilization=0.1,
            enforce_eager=True,
            generated_model=False,
        )
        env = serve_env(data, "cpu", cpu_kvcache_gib=1, connector=transfer is not None)
        if transfer is not None:
            env |= data  # the ConfigMap as envFrom puts it
        ports = [free_port() for _ in range(replicas)]
        procs = []
        for n, port in enumerate(ports):
            cmd = serve_command(settings.vllm_python, settings.model, transfer, data, port, flags)
            cmd += ["--num-gpu-blocks-override", str(settings.engine_blocks)]
            procs.append((start(cmd, work / f"vllm-{n}.log", env), port, work / f"vllm-{n}.log"))
            stack.callback(stop, procs[-1][0])
        for proc, port, log in procs:
            wait_ready(port, proc, log, settings.start_timeout)
        urls = [f"http://127.0.0.1:{port}" for port in ports]
        for url in urls:  # the engine's own first-request costs are not the point's
            asyncio.run(single(url, [7, 8, 9, 10] * 8))
        kv_cache = kv_cache_lines(tail(procs[0][2], 400))
        yield Engines(urls, ports, server, kv_cache, [proc.pid for proc, _, _ in procs])


def verdict_spec(min_lookups: int) -> KVCacheTierSpec:
    """The tier as the bench runs it: its chunk size, a window no shorter than allowed (a point's deltas are
    judged whole either way) and a lookup floor a short point reaches."""
    return KVCacheTierSpec.model_validate(
        {"chunkTokens": CHUNK_TOKENS, "offloadVerdict": {"windowSeconds": 30, "minLookups": min_lookups}}
    )


def _engine_counters(port: int) -> dict[str, float]:
    return metric_sums(get(port, "/metrics")[1].decode())


def _scrape(engines: Engines) -> tuple[list[dict[str, float]], dict[str, Any] | None]:
    """The engines' counters, and (with a server) the verdict's sample of it and of the engines' prefill sums."""
    texts = [get(port, "/metrics")[1].decode() for port in engines.ports]  # the verdict parses the text too
    cpu = {CPU_SECONDS["engines"]: cpu_seconds(engines.pids)}
    if engines.server is not None and engines.server.process is not None:
        cpu[CPU_SECONDS["strata_server"]] = cpu_seconds([engines.server.process.pid])
    pages = [*(metric_sums(t) for t in texts), cpu]
    if engines.server is None:
        return pages, None
    usage = scrape("127.0.0.1", engines.server.metrics_port)
    assert usage is not None, "the Strata server's /metrics did not answer"
    prefill = [(f"engine/{n}", parse_engine_metrics(t)) for n, t in enumerate(texts)]
    return pages, sample([("bench/0", usage)], rfc3339(time.time()), prefill)


def judged(spec: KVCacheTierSpec, before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The operator's verdict on what happened between two samples (its window starts at `before`)."""
    first, _ = offload_status(spec, None, before)
    status, message = offload_status(spec, first, after)
    return {k: v for k, v in status.items() if k != "window"} | {"message": message}


def run_rounds(
    experiment: str,
    sides: Sequence[str],
    workload: Workload,
    seconds: float,
    rounds: int,
    settings: Settings,
    work: Path,
) -> Iterator[dict[str, Any]]:
    """Every side's engines started and its users' documents primed once, then `rounds` rounds in which the sides
    take turns, `seconds` of users each (the order rotated every round); yields each point as it is measured.

    Priming is the costly part where prefill is slow (64 users' documents took over 20 minutes a side on an AVX2
    CPU), so rounds on the same engines pay it once. A side's users go on with their conversations from one of its
    turns to the next. While one side is measured the others sit idle, all started: the CPU seconds they spend
    meanwhile are recorded with the point (`idle_sides_cpu_seconds`), since on two cores any would be taken from
    the side measured."""
    with contextlib.ExitStack() as stack:
        running: dict[str, Engines] = {}
        people = {side: users(workload) for side in sides}
        primed: dict[str, int] = {}
        for side in sides:  # one side's engines up and primed before the next starts: memory grows by one at a time
            running[side] = stack.enter_context(side_engines(side, settings, work / side))
            started = time.monotonic()
            primed[side] = asyncio.run(prime(running[side].urls, workload, people[side], settings.prime_timeout))
            print(f"  {side}: {primed[side]} prompt tokens primed in {time.monotonic() - started:.0f}s", flush=True)
        for n in range(rounds):
            for side in rotated(sides, n):
                engines = running[side]
                idle = [pid for other in sides if other != side for pid in _process_ids(running[other])]
                idle_before, busy_before = cpu_seconds(idle), machine_busy_seconds()
                pages_before, tier_before = _scrape(engines)
                requests = asyncio.run(run_users(engines.urls, workload, people[side], seconds))
                pages_after, tier_after = _scrape(engines)
                idle_spent, busy = cpu_seconds(idle) - idle_before, machine_busy_seconds() - busy_before
                point: dict[str, Any] = {
                    "experiment": experiment,
                    "side": side,
                    "x": workload.users if experiment == "scale" else workload.reuse_share,
                    "users": workload.users,
                    "reuse_share": workload.reuse_share,
                    "primed_prompt_tokens": primed[side],
                    "engine_kv_cache": engines.kv_cache,
                    "round_on_these_engines": n,
                    "idle_sides_cpu_seconds": round(idle_spent, 2),
                }
                delta = metric_delta(pages_before, pages_after)
                point |= request_summary(requests, seconds) | engine_summary(delta)
                point["cpu_seconds"] = {k: round(delta[v], 2) for k, v in CPU_SECONDS.items() if v in delta}
                side_spent = sum(delta.get(v, 0.0) for v in CPU_SECONDS.values())
                point["machine_busy_cpu_seconds"] = round(busy, 2)
                point["others_cpu_seconds"] = round(busy - side_spent - idle_spent, 2)
                point["reused_ttft_p50_s"] = request_summary([r for r in requests if r["reuses"]], seconds)[
                    "ttft_p50_s"
                ]
                if tier_before is not None and tier_after is not None:
                    point["offload"] = judged(verdict_spec(settings.min_lookups), tier_before, tier_after)
                yield point


def machine_busy_seconds() -> float:
    """CPU seconds every core of the machine has spent on anything so far: a point's share not spent by the
    engines measured nor by the idle sides (`others_cpu_seconds`: the bench's own users and whatever else ran) says
    how quiet the machine was. Linux counts guest time inside user time, and idle and iowait are not spent."""
    times = psutil.cpu_times()._asdict()
    return sum(v for k, v in times.items() if k not in ("idle", "iowait", "guest", "guest_nice"))


def _process_ids(engines: Engines) -> list[int]:
    """The engines' API servers and the side's Strata server (each process's children count with it)."""
    server = engines.server.process.pid if engines.server is not None and engines.server.process else None
    return [*engines.pids, *([server] if server is not None else [])]


def run_lengths(
    side: str, lengths: Sequence[int], samples: int, settings: Settings, work: Path, seed: int = 0
) -> list[dict[str, Any]]:
    """Single-request TTFT per document length (and a 16-token question): each sample a new document, first
    computed (cold), then, after the engine's prefix cache is emptied (and its CPU tier too where a tier behind it
    holds the document), asked again with another question (warm: loaded from the side's tier, or recomputed)."""
    points = []
    with side_engines(side, settings, work) as engines:
        url, port = engines.urls[0], engines.ports[0]
        for length in lengths:
            cold: list[float] = []
            warm: list[float] = []
            timelines: list[dict[str, float]] = []
            pages_before, _ = _scrape(engines)
            for n in range(samples):
                rng = random.Random(f"length/{seed}/{length}/{n}")
                doc = [rng.randrange(3, 32000) for _ in range(length)]  # whole chunks: all of it can be reused
                first, second = ([rng.randrange(3, 32000) for _ in range(16)] for _ in range(2))
                cold.append(asyncio.run(single(url, doc + first)))
                reset_prefix_cache(port, external=SIDES[side][0] in STORING_SIDES)
                time.sleep(0.2)
                before = _engine_counters(port)
                warm.append(asyncio.run(single(url, doc + second)))
                timelines.append(request_timeline(metric_delta([before], [_counted_one_more(port, before)])))
            pages_after, _ = _scrape(engines)
            point: dict[str, Any] = {"experiment": "ttft", "side": side, "x": length}
            point |= {"cold_ttft_s": cold, "warm_ttft_s": warm, "warm_timeline": timelines}
            points.append(point | engine_summary(metric_delta(pages_before, pages_after)))
            print(
                f"  {side} {length} tokens: warm {sorted(warm)[len(warm) // 2]:.3f}s, the tier loaded "
                f"{points[-1]['loaded_bytes'] / 2**20:.0f} MiB into the engine",
                flush=True,
            )
    return points


def _counted_one_more(port: int, before: dict[str, float], timeout_s: float = 10.0) -> dict[str, float]:
    """The engine's counters once they count the request just answered: vLLM records a request's times after its
    answer has left, so a page read at once may not have them yet."""
    queued = "vllm:request_queue_time_seconds_count"
    deadline = time.monotonic() + timeout_s
    while True:
        page = _engine_counters(port)
        if page.get(queued, 0.0) > before.get(queued, 0.0) or time.monotonic() > deadline:
            return page
        time.sleep(0.01)
