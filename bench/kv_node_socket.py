"""The vLLM tier's own calls over the node socket (Unix) and over TCP: store, lookup and load of one request's chunks.

What `strata_kv.vllm.tier.StrataTier` does per request, with its own client code (`EngineLink`,
`KVClient.set_many_from`, `get_many_into`, `STRATA.PREFIX`) against a real `strata-kv`: `--jobs` requests of
`--chunks` chunks of `--chunk-kib` each, every request's chunks stored in one job on an I/O thread of its own (the
tier's pool), looked up in one STRATA.PREFIX each, and loaded into a page-aligned mapping in /dev/shm (what vLLM's
CPU primary tier is). Both sides share one server; each round runs them back to back in alternating order, so a
round compares them under one machine state, and the ratio printed is the median of the rounds' unix/tcp ratios.
`--busy N` runs N processes that spin on sched_yield, as vLLM's engine core does while its worker computes;
`--gil-busy N` runs N threads in the bench that hold the GIL, as vLLM's scheduler thread does in the process the
tier lives in (each return from a blocking call then waits for the GIL).

`--syscalls` also counts both processes' system calls per chunk for each side and operation (the kernel's
tracepoints through `perf stat`, one extra pass): the client's sends, receives, polls and GIL waits (futex), the
server's reads, writes and event-loop wake-ups (epoll_pwait).

`--kvserver DIR` runs another checkout's `strata_kv` (server and client) to compare code: the JSON names it in
`label`, and `--report a.json b.json ...` plots saved runs side by side.

    .venv/bin/python bench/kv_node_socket.py [--rounds 12] [--jobs 4] [--chunks 8] [--chunk-kib 1024] [--busy 2]
        [--gil-busy 1] [--syscalls]
        [--kvserver ../other/kvserver --label before] [--json bench/results/kv_node_socket/after.json]
    .venv/bin/python bench/kv_node_socket.py --report a.json b.json --png bench/results/kv_node_socket/socket.png
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SIDES = ("tcp", "unix")
OPS = ("store", "lookup", "load")


def spinners(count: int) -> list[int]:
    """Processes that keep the cores busy the way vLLM's engine core waits for its worker (sched_yield)."""
    pids = []
    for _ in range(count):
        pid = os.fork()
        if pid == 0:
            while True:
                os.sched_yield()
        pids.append(pid)
    return pids


def store_chunks(link: Any, keys: list[bytes], source: memoryview, chunk: int) -> None:
    """The tier's store job: the chunks' SETs at once (`KVClient.set_many_from`), straight from the primary
    tier's memory."""
    items = [(key, source[i * chunk : (i + 1) * chunk]) for i, key in enumerate(keys)]
    stored, error = link.call(lambda c: c.set_many_from(items))
    if error is not None or not all(stored):
        raise SystemExit(f"chunks not stored: {stored}, {error}")


def load_chunks(link: Any, keys: list[bytes], dest: memoryview, chunk: int) -> None:
    """The tier's load job: the chunks' GETs at once (`KVClient.get_many_into`), straight into the primary tier's
    memory."""
    views = [dest[i * chunk : (i + 1) * chunk] for i in range(len(keys))]
    found, error = link.call(lambda c: c.get_many_into(keys, views))
    if error is not None or not all(found):
        raise SystemExit(f"chunks missing right after their store: {found}, {error}")


def load_chunks_each(link: Any, keys: list[bytes], dest: memoryview, chunk: int) -> None:
    """The tier's load job before `get_many_into`: one GET per chunk (`get_into`), for comparison."""
    for i, key in enumerate(keys):
        if not link.call(lambda c, k=key, v=dest[i * chunk : (i + 1) * chunk]: c.get_into(k, v)):
            raise SystemExit(f"chunk {key!r} missing right after its store")


def gil_spinner(stop: threading.Event) -> None:
    """Python bytecode without a pause: vLLM's scheduler thread, which holds the GIL the tier's I/O threads need
    after every blocking call (the switch interval, 5 ms, is how long one may wait for it)."""
    n = 0
    while not stop.is_set():
        n += 1


def each(
    link: Any,
    jobs: list[list[bytes]],
    step: Callable[..., None],
    view: memoryview,
    chunk: int,
    pool: ThreadPoolExecutor,
) -> None:
    """`step` (store or load) of every job at once, each on an I/O thread, into or out of its own chunks of `view`."""
    at = [j * len(keys) * chunk for j, keys in enumerate(jobs)]
    for future in [pool.submit(step, link, keys, view[a:], chunk) for keys, a in zip(jobs, at, strict=True)]:
        future.result()


def one_request(
    link: Any, jobs: list[list[bytes]], source: memoryview, dest: memoryview, chunk: int, pool: ThreadPoolExecutor
) -> dict[str, float]:
    """Seconds for the tier's three steps on `jobs` (one request's chunks each), the tier's own calls in its order:
    the jobs' stores on the tier's I/O threads at once, one lookup per job, their loads at once."""
    out = {}
    start = time.perf_counter()
    each(link, jobs, store_chunks, source, chunk, pool)
    out["store"] = time.perf_counter() - start
    start = time.perf_counter()
    for keys in jobs:
        leading, _tiers = link.call(lambda c, k=keys: c.call("STRATA.PREFIX", *k))
        if int(leading) != len(keys):
            raise SystemExit(f"the server holds {leading} of {len(keys)} chunks just stored")
    out["lookup"] = time.perf_counter() - start
    start = time.perf_counter()
    each(link, jobs, load_chunks, dest, chunk, pool)
    out["load"] = time.perf_counter() - start
    size = sum(len(keys) for keys in jobs) * chunk
    if dest[:size] != source[:size]:
        raise SystemExit("a loaded chunk differs from what was stored")
    return out


SYSCALLS = (
    "read", "write", "recvfrom", "sendto", "recvmsg", "sendmsg", "poll", "epoll_wait", "epoll_pwait", "futex",
    "preadv", "preadv2", "mmap", "munmap", "setsockopt", "getsockname", "io_uring_enter",
)  # fmt: skip
"""What `--syscalls` counts: the socket's, the event loop's, the GIL's (futex) and a memfd's."""


def syscalls_per_chunk(pids: dict[str, int], run: Callable[[], None], chunks: int) -> dict[str, dict[str, float]]:
    """System calls per chunk of each process in `pids` (every thread) during `run()`, counted by the kernel's
    tracepoints (`perf stat`): cheap enough to leave the transfer's timing, hence its wake-ups, as they are."""
    events = ",".join(f"syscalls:sys_enter_{name}" for name in SYSCALLS)
    reports = {who: tempfile.NamedTemporaryFile("r", suffix=".perf") for who in pids}  # noqa: SIM115 (closed below)
    counters = {
        who: subprocess.Popen(
            ["perf", "stat", "-x", ",", "-o", reports[who].name, "-e", events, "-p", str(pid)],
            stderr=subprocess.DEVNULL,
        )
        for who, pid in pids.items()
    }
    time.sleep(0.5)  # attached to every thread before the first call
    run()
    out: dict[str, dict[str, float]] = {}
    for who, counter in counters.items():
        counter.send_signal(signal.SIGINT)
        counter.wait(30)
        with reports[who] as report:
            for line in report.read().splitlines():
                fields = line.split(",")
                if len(fields) > 2 and fields[2].startswith("syscalls:sys_enter_") and fields[0].isdigit():
                    out.setdefault(who, {})[fields[2].removeprefix("syscalls:sys_enter_")] = int(fields[0]) / chunks
    return out


def measure(args: argparse.Namespace) -> dict[str, Any]:
    sys.path[:0] = [str(ROOT / "testsupport"), str(args.kvserver)]
    os.environ["PYTHONPATH"] = str(args.kvserver)  # the server runs the same checkout
    from strata_kv.vllm.engine_link import Endpoint, EngineLink
    from strata_testsupport.kvserver import running_kv_server

    chunk = args.chunk_kib * 1024
    size = chunk * args.chunks * args.jobs
    source = mmap.mmap(-1, size)
    source[:] = os.urandom(size)
    with tempfile.TemporaryDirectory(prefix="kv-node-socket-") as tmp:
        with open("/dev/shm/kv-node-socket-bench", "w+b") as primary:  # vLLM's primary tier lives in /dev/shm
            primary.truncate(size)
            dest_map = mmap.mmap(primary.fileno(), size)
        os.unlink("/dev/shm/kv-node-socket-bench")
        config: dict[str, Any] = {"l1": {"size": "4GiB"}, "metrics": {"port": -1}}
        if args.shared_memory:
            config["listen"] = {"shared_memory": True}
        samples: dict[str, dict[str, list[float]]] = {side: {op: [] for op in OPS} for side in SIDES}
        syscalls: dict[str, dict[str, dict[str, dict[str, float]]]] = {}
        busy = spinners(args.busy)
        pool = ThreadPoolExecutor(args.jobs, thread_name_prefix="tier-io")
        stop_spinning = threading.Event()
        gil = [threading.Thread(target=gil_spinner, args=(stop_spinning,), daemon=True) for _ in range(args.gil_busy)]
        for thread in gil:
            thread.start()
        try:
            with running_kv_server(Path(tmp) / "kv", config, l2_fs=False) as server:
                endpoints = {
                    "tcp": Endpoint("127.0.0.1", server.port),
                    "unix": Endpoint(unix_socket=server.unix_socket),
                }
                links = {side: EngineLink(endpoints[side], max_idle=args.jobs) for side in SIDES}
                dest, src = memoryview(dest_map), memoryview(source)

                def keys(tag: str, side: str) -> list[list[bytes]]:
                    return [
                        [b"%s-%s-%d-%d" % (tag.encode(), side.encode(), j, i) for i in range(args.chunks)]
                        for j in range(args.jobs)
                    ]

                for side in SIDES:  # connect, and one request each before anything counts
                    one_request(links[side], keys("warm", side), src, dest, chunk, pool)
                for r in range(args.rounds):
                    for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                        for op, seconds in one_request(
                            links[side], keys(f"r{r}", side), src, dest, chunk, pool
                        ).items():
                            samples[side][op].append(seconds)
                if args.syscalls:
                    # The client's counter starts last: it counts what the process forks later (the other counter).
                    pids = {"server": server.process.pid, "client": os.getpid()}
                    for side in SIDES:
                        jobs = keys("syscalls", side)
                        chunks = args.jobs * args.chunks
                        syscalls[side] = {
                            op: syscalls_per_chunk(
                                pids, partial(each, links[side], jobs, step, view, chunk, pool), chunks
                            )
                            for op, step, view in (("store", store_chunks, src), ("load", load_chunks, dest))
                        }
                for link in links.values():
                    link.close()
                dest.release()
                src.release()
        finally:
            stop_spinning.set()
            pool.shutdown()
            for pid in busy:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    return {
        "label": args.label,
        "kvserver": str(args.kvserver),
        "chunks": args.chunks,
        "chunk_bytes": chunk,
        "busy": args.busy,
        "jobs": args.jobs,
        "gil_busy": args.gil_busy,
        "shared_memory": args.shared_memory,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "samples_ms": {s: {op: [x * 1000 for x in xs] for op, xs in ops.items()} for s, ops in samples.items()},
        "syscalls_per_chunk": syscalls,
    }


def summary(run: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Median and quartiles per side and operation, in ms; under `unix/tcp`, those of the rounds' ratios."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    samples = run["samples_ms"]
    ratios = {op: [u / t for t, u in zip(samples["tcp"][op], samples["unix"][op], strict=True)] for op in OPS}
    for side, ops in [*samples.items(), ("unix/tcp", ratios)]:
        for op, xs in ops.items():
            q = statistics.quantiles(xs, n=4)
            out.setdefault(side, {})[op] = {"median": statistics.median(xs), "p25": q[0], "p75": q[2], "n": len(xs)}
    return out


def merged(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs of one label (one checkout measured in several alternating runs) as one: their samples together."""
    by_label: dict[str, dict[str, Any]] = {}
    for run in runs:
        if run["label"] not in by_label:
            by_label[run["label"]] = json.loads(json.dumps(run))
            continue
        into = by_label[run["label"]]
        into["rounds"] += run["rounds"]
        for side, ops in run["samples_ms"].items():
            for op, xs in ops.items():
                into["samples_ms"][side][op] += xs
    return list(by_label.values())


def plot(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(OPS), figsize=(max(11, 2.2 * len(runs) + 6), 4.2))
    for ax, op in zip(axes, OPS, strict=True):
        labels, data = [], []
        for run in runs:
            for side in SIDES:
                labels.append(f"{run['label']}\n{side}")
                data.append(run["samples_ms"][side][op])
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=7, rotation=60)
        ax.set_title(f"{op} ({runs[0].get('jobs', 1)} x {runs[0]['chunks']} x {runs[0]['chunk_bytes'] >> 10} KiB)")
        ax.set_ylabel("ms")
    first = runs[0]
    fig.suptitle(
        f"Strata tier calls, node socket vs TCP ({first.get('jobs', 1)} jobs at once, {first.get('gil_busy', 0)} GIL"
        f" holder, {first['busy']} busy spinners, {first['cpus']} CPUs)"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--chunks", type=int, default=8, help="chunks per request (2,048 tokens at 256 a chunk)")
    parser.add_argument("--chunk-kib", type=int, default=1024, help="1 MiB: a 256-token chunk of bench/vllm_cpu_ttft")
    parser.add_argument("--busy", type=int, default=0, help="spinning processes beside the bench")
    parser.add_argument("--jobs", type=int, default=1, help="requests moved at once, each on an I/O thread of its own")
    parser.add_argument(
        "--gil-busy", type=int, default=0, help="threads in the bench holding the GIL (vLLM's scheduler)"
    )
    parser.add_argument("--shared-memory", action="store_true", help="the server hands values over (nodeSocket)")
    parser.add_argument("--syscalls", action="store_true", help="count both processes' system calls per chunk")
    parser.add_argument("--kvserver", type=Path, default=ROOT / "kvserver", help="the checkout's kvserver/ to run")
    parser.add_argument("--label", default="this checkout")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--report", type=Path, nargs="+", help="plot and tabulate saved runs instead of measuring")
    parser.add_argument("--png", type=Path)
    args = parser.parse_args()
    runs = merged([json.loads(p.read_text()) for p in args.report]) if args.report else [measure(args)]
    for run in runs:
        if not args.report and args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(run | {"summary": summary(run)}, indent=2))
        for side, ops in summary(run).items():
            cells = "  ".join(f"{op} {v['median']:6.2f} [{v['p25']:5.2f}-{v['p75']:5.2f}]" for op, v in ops.items())
            unit = "ratio" if "/" in side else "ms"
            print(f"{run['label']:<14} {side:<8} {unit} median [quartiles], n={run['rounds']}: {cells}")
        for side, ops in run.get("syscalls_per_chunk", {}).items():
            for op, processes in ops.items():
                for who, counts in processes.items():
                    top = ", ".join(f"{name} {n:.1f}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1]) if n)
                    print(f"{run['label']:<14} {side:<8} {op:<5} {who} syscalls per chunk: {top}")
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        plot(runs, args.png)


if __name__ == "__main__":
    main()
