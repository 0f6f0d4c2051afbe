"""The vLLM tier's own calls over the node socket (Unix) and over TCP: store, lookup and load of one request's chunks.

What `strata_kv.vllm.tier.StrataTier` does per request, with its own client code (`EngineLink`, `KVClient.set_from`,
`get_into`, `STRATA.PREFIX`) against a real `strata-kv`: `--chunks` chunks of `--chunk-kib` each stored one after
another on one connection, looked up in one STRATA.PREFIX, and loaded into a page-aligned mapping in /dev/shm (what
vLLM's CPU primary tier is). Both sides share one server; each round runs them back to back in alternating order,
so a round compares them under one machine state. `--busy N` runs N processes that spin on sched_yield, as vLLM's
engine core does while its worker computes, so the wake-ups a transfer needs are scheduled the way a busy node
schedules them.

`--strace` also counts the server's system calls per chunk for each side and operation (strace -c on the server
for one extra pass): the wake-ups of its event loop (epoll_pwait) and the reads and writes a chunk takes.

`--kvserver DIR` runs another checkout's `strata_kv` (server and client) to compare code: the JSON names it in
`label`, and `--report a.json b.json ...` plots saved runs side by side.

    .venv/bin/python bench/kv_node_socket.py [--rounds 12] [--chunks 8] [--chunk-kib 1024] [--busy 2] [--strace]
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
import time
from collections.abc import Callable
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
    """The tier's store job: one SET per chunk, straight from the primary tier's memory."""
    for i, key in enumerate(keys):
        link.call(lambda c, k=key, v=source[i * chunk : (i + 1) * chunk]: c.set_from(k, v))


def load_chunks(link: Any, keys: list[bytes], dest: memoryview, chunk: int) -> None:
    """The tier's load job: one GET per chunk, straight into the primary tier's memory."""
    for i, key in enumerate(keys):
        if not link.call(lambda c, k=key, v=dest[i * chunk : (i + 1) * chunk]: c.get_into(k, v)):
            raise SystemExit(f"chunk {key!r} missing right after its store")


def one_request(link: Any, keys: list[bytes], source: memoryview, dest: memoryview, chunk: int) -> dict[str, float]:
    """Seconds for the tier's three steps on one request's chunks (the tier's own calls, in its order)."""
    out = {}
    start = time.perf_counter()
    store_chunks(link, keys, source, chunk)
    out["store"] = time.perf_counter() - start
    start = time.perf_counter()
    leading, _tiers = link.call(lambda c: c.call("STRATA.PREFIX", *keys))
    out["lookup"] = time.perf_counter() - start
    if int(leading) != len(keys):
        raise SystemExit(f"the server holds {leading} of {len(keys)} chunks just stored")
    start = time.perf_counter()
    load_chunks(link, keys, dest, chunk)
    out["load"] = time.perf_counter() - start
    if dest[: len(keys) * chunk] != source[: len(keys) * chunk]:
        raise SystemExit("a loaded chunk differs from what was stored")
    return out


def syscalls_per_chunk(server_pid: int, run: Callable[[], None], chunks: int) -> dict[str, float]:
    """The server's system calls during `run()`, per chunk, from `strace -c -p` (counts only)."""
    with tempfile.NamedTemporaryFile("r", suffix=".strace") as report:
        tracer = subprocess.Popen(
            ["strace", "-c", "-f", "-o", report.name, "-p", str(server_pid)], stderr=subprocess.DEVNULL
        )
        time.sleep(1.0)  # attached to every thread before the first call
        run()
        tracer.send_signal(signal.SIGINT)
        tracer.wait(30)
        counts = {}
        for line in report.read().splitlines():
            parts = line.split()
            if len(parts) >= 5 and parts[-1].isidentifier() and parts[3].isdigit():
                counts[parts[-1]] = int(parts[3]) / chunks
        return counts


def measure(args: argparse.Namespace) -> dict[str, Any]:
    sys.path[:0] = [str(ROOT / "testsupport"), str(args.kvserver)]
    os.environ["PYTHONPATH"] = str(args.kvserver)  # the server runs the same checkout
    from strata_kv.vllm.engine_link import Endpoint, EngineLink
    from strata_testsupport.kvserver import running_kv_server

    chunk = args.chunk_kib * 1024
    size = chunk * args.chunks
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
        syscalls: dict[str, dict[str, dict[str, float]]] = {}
        busy = spinners(args.busy)
        try:
            with running_kv_server(Path(tmp) / "kv", config, l2_fs=False) as server:
                endpoints = {
                    "tcp": Endpoint("127.0.0.1", server.port),
                    "unix": Endpoint(unix_socket=server.unix_socket),
                }
                links = {side: EngineLink(endpoints[side], max_idle=1) for side in SIDES}
                dest, src = memoryview(dest_map), memoryview(source)
                for side in SIDES:  # connect, and one request each before anything counts
                    one_request(
                        links[side], [b"warm-%s-%d" % (side.encode(), i) for i in range(args.chunks)], src, dest, chunk
                    )
                for r in range(args.rounds):
                    for side in SIDES if r % 2 == 0 else SIDES[::-1]:
                        keys = [b"r%d-%s-%d" % (r, side.encode(), i) for i in range(args.chunks)]
                        for op, seconds in one_request(links[side], keys, src, dest, chunk).items():
                            samples[side][op].append(seconds)
                if args.strace:
                    for side in SIDES:
                        keys = [b"strace-%s-%d" % (side.encode(), i) for i in range(args.chunks)]
                        pid, link = server.process.pid, links[side]
                        syscalls[side] = {
                            "store": syscalls_per_chunk(
                                pid, partial(store_chunks, link, keys, src, chunk), args.chunks
                            ),
                            "load": syscalls_per_chunk(pid, partial(load_chunks, link, keys, dest, chunk), args.chunks),
                        }
                for link in links.values():
                    link.close()
                dest.release()
                src.release()
        finally:
            for pid in busy:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
    return {
        "label": args.label,
        "kvserver": str(args.kvserver),
        "chunks": args.chunks,
        "chunk_bytes": chunk,
        "busy": args.busy,
        "shared_memory": args.shared_memory,
        "rounds": args.rounds,
        "cpus": os.cpu_count(),
        "samples_ms": {s: {op: [x * 1000 for x in xs] for op, xs in ops.items()} for s, ops in samples.items()},
        "server_syscalls_per_chunk": syscalls,
    }


def summary(run: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Median and quartiles per side and operation, in ms."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for side, ops in run["samples_ms"].items():
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

    fig, axes = plt.subplots(1, len(OPS), figsize=(11, 3.6))
    for ax, op in zip(axes, OPS, strict=True):
        labels, data = [], []
        for run in runs:
            for side in SIDES:
                labels.append(f"{run['label']}\n{side}")
                data.append(run["samples_ms"][side][op])
        ax.boxplot(data, showfliers=False)
        ax.set_xticks(range(1, len(labels) + 1), labels, fontsize=8)
        ax.set_title(f"{op} ({runs[0]['chunks']} x {runs[0]['chunk_bytes'] >> 10} KiB)")
        ax.set_ylabel("ms")
    fig.suptitle(f"Strata tier calls, node socket vs TCP ({runs[0]['busy']} busy spinners, {runs[0]['cpus']} CPUs)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--chunks", type=int, default=8, help="chunks per request (2,048 tokens at 256 a chunk)")
    parser.add_argument("--chunk-kib", type=int, default=1024, help="1 MiB: a 256-token chunk of bench/vllm_cpu_ttft")
    parser.add_argument("--busy", type=int, default=0, help="spinning processes beside the bench")
    parser.add_argument("--shared-memory", action="store_true", help="the server hands values over (nodeSocket)")
    parser.add_argument("--strace", action="store_true", help="count the server's system calls per chunk")
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
            print(f"{run['label']:<12} {side:<5} ms median [quartiles], n={run['rounds']}: {cells}")
        for side, ops in run["server_syscalls_per_chunk"].items():
            for op, counts in ops.items():
                top = ", ".join(f"{name} {n:.1f}" for name, n in sorted(counts.items(), key=lambda kv: -kv[1])[:4])
                print(f"{run['label']:<12} {side:<5} server syscalls per chunk, {op}: {top}")
    if args.png:
        args.png.parent.mkdir(parents=True, exist_ok=True)
        plot(runs, args.png)


if __name__ == "__main__":
    main()
