"""Where a load's time goes: one request's chunks into vLLM's CPU tier over each of Strata's paths, against the
same bytes read from files the way vLLM's `fs` tier reads them.

The serving-scale bench (`serving_scale.py`) puts `vllm-fs` a few percent ahead of Strata over TCP at 16-64 users
on two cores, where the engines use every core-second and what a load costs in CPU comes out of the prefill.
This bench isolates that cost. Per round, with the order rotated, one load of `--chunks` chunks of `--chunk-kib`
(default 64 x 1 MiB: a 16k-token prompt of the serving bench's model) into a page-aligned mapping in /dev/shm
(what vLLM's CPU tier is), by:

- `fs`: one file per chunk on this disk, opened, `readv` into the tier, closed (vLLM 0.33's `fs` tier, its Python
  path): one kernel copy out of the page cache;
- `tcp`, `unix`: the tier's own load job (`kv_node_socket.load_chunks`: `EngineLink`, `KVClient.get_many_into`,
  the job's GETs sent at once) against a real `strata-kv` over TCP and over its Unix socket: the server writes the
  value into the socket, the engine reads it out (two copies);
- `tcp-each`, `unix-each`: the load job before that, one GET per chunk (`get_into`; four returns from the kernel
  per chunk against one);
- `shm`: the same over the Unix socket of a server with `listen.shared_memory` (`nodeSocket.sharedMemory`): the
  value's memfd is handed over and `preadv` copies it once;
- `memfd`: that copy alone, `preadv` out of memfds holding the chunks, no server and no protocol: the floor of
  `shm`.

`--gil-busy N` runs N threads that hold the GIL (`kv_node_socket.gil_spinner`), as vLLM's scheduler does in the
process the tier lives in: every return from a blocking call then waits for the GIL, up to the 5 ms switch
interval, which is where the number of returns per chunk shows.

Wall time and CPU time per load (this process's, i.e. the engine's side, plus the server's) are printed as
medians with quartiles and as ratios to `fs`; JSON and a plot under `--output`.

    .venv/bin/python bench/kv_load_paths.py [--rounds 20] [--chunks 64] [--chunk-kib 1024] [--gil-busy 1]
        [--output DIR]
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _part in ("bench", "testsupport", "kvserver"):
    if str(ROOT / _part) not in sys.path:
        sys.path.insert(0, str(ROOT / _part))

import psutil  # noqa: E402
from kv_node_socket import gil_spinner, load_chunks, load_chunks_each  # noqa: E402

SIDES = ("fs", "tcp", "unix", "tcp-each", "unix-each", "shm", "memfd")


def read_files(paths: list[Path], dest: memoryview, chunk: int) -> None:
    """vLLM's `fs` tier loading a job on its Python path (`_load_block`): open, one `readv`, close, per chunk."""
    for i, path in enumerate(paths):
        fd = os.open(path, os.O_RDONLY)
        try:
            if os.readv(fd, [dest[i * chunk : (i + 1) * chunk]]) != chunk:
                raise SystemExit(f"short read of {path}")
        finally:
            os.close(fd)


def read_memfds(fds: list[int], dest: memoryview, chunk: int) -> None:
    """The copy a shared-memory load makes, and nothing else."""
    for i, fd in enumerate(fds):
        if os.preadv(fd, [dest[i * chunk : (i + 1) * chunk]], 0) != chunk:
            raise SystemExit("short read of a memfd")


def timed(run: Callable[[], None], server: psutil.Process) -> tuple[float, float]:
    """Wall seconds and CPU seconds (this process and the server together) of one load."""
    cpu0, server0, wall0 = time.process_time(), server.cpu_times(), time.perf_counter()
    run()
    wall, server1 = time.perf_counter() - wall0, server.cpu_times()
    cpu = time.process_time() - cpu0 + (server1.user - server0.user) + (server1.system - server0.system)
    return wall, cpu


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from strata_kv.vllm.engine_link import Endpoint, EngineLink
    from strata_testsupport.kvserver import running_kv_server

    chunk = args.chunk_kib * 1024
    size = chunk * args.chunks
    payload = os.urandom(size)
    samples: dict[str, dict[str, list[float]]] = {side: {"wall_ms": [], "cpu_ms": []} for side in SIDES}
    with tempfile.TemporaryDirectory(prefix="kv-load-paths-", dir=args.workdir) as tmp:
        with open("/dev/shm/kv-load-paths-bench", "w+b") as primary:  # vLLM's CPU tier lives in /dev/shm
            primary.truncate(size)
            dest_map = mmap.mmap(primary.fileno(), size)
        os.unlink("/dev/shm/kv-load-paths-bench")
        dest = memoryview(dest_map)
        files = []
        for i in range(args.chunks):
            files.append(Path(tmp) / f"chunk-{i:04d}.bin")
            files[-1].write_bytes(payload[i * chunk : (i + 1) * chunk])
        memfds = []
        for i in range(args.chunks):
            memfds.append(os.memfd_create(f"kv-load-paths-{i}"))
            os.pwrite(memfds[-1], payload[i * chunk : (i + 1) * chunk], 0)
        config = {"l1": {"size": "4GiB"}, "metrics": {"port": -1}, "listen": {"shared_memory": True}}
        with running_kv_server(Path(tmp) / "kv", config, l2_fs=False) as server:
            assert server.process is not None
            links = {
                "tcp": EngineLink(Endpoint("127.0.0.1", server.port)),
                "unix": EngineLink(Endpoint(unix_socket=server.unix_socket)),
                "shm": EngineLink(Endpoint(unix_socket=server.unix_socket)),
            }
            keys = [b"kv-load-paths/%d" % i for i in range(args.chunks)]
            links["tcp"].call(lambda c: [c.set(k, payload[i * chunk : (i + 1) * chunk]) for i, k in enumerate(keys)])

            def plain(client: Any) -> None:
                client._shared_memory = False  # this side measures the bytes through the socket

            links["unix"].call(plain)
            links["unix-each"] = EngineLink(Endpoint(unix_socket=server.unix_socket))
            links["unix-each"].call(plain)
            loads: dict[str, Callable[[], None]] = {
                "fs": lambda: read_files(files, dest, chunk),
                "tcp": lambda: load_chunks(links["tcp"], keys, dest, chunk),
                "unix": lambda: load_chunks(links["unix"], keys, dest, chunk),
                "tcp-each": lambda: load_chunks_each(links["tcp"], keys, dest, chunk),
                "unix-each": lambda: load_chunks_each(links["unix-each"], keys, dest, chunk),
                "shm": lambda: load_chunks(links["shm"], keys, dest, chunk),
                "memfd": lambda: read_memfds(memfds, dest, chunk),
            }
            process = psutil.Process(server.process.pid)
            for side in SIDES:  # connections made, pages touched, before anything counts
                loads[side]()
                if dest[:chunk] != payload[:chunk]:
                    raise SystemExit(f"{side} loaded other bytes than were stored")
            stop = threading.Event()
            spinners = [threading.Thread(target=gil_spinner, args=(stop,), daemon=True) for _ in range(args.gil_busy)]
            for spinner in spinners:
                spinner.start()
            try:
                for r in range(args.rounds):
                    order = SIDES[r % len(SIDES) :] + SIDES[: r % len(SIDES)]
                    for side in order:
                        wall, cpu = timed(loads[side], process)
                        samples[side]["wall_ms"].append(wall * 1000)
                        samples[side]["cpu_ms"].append(cpu * 1000)
            finally:
                stop.set()
                for spinner in spinners:
                    spinner.join()
            for link in links.values():
                link.close()
        for fd in memfds:
            os.close(fd)
        dest.release()
    return {
        "chunks": args.chunks,
        "chunk_bytes": chunk,
        "rounds": args.rounds,
        "gil_busy": args.gil_busy,
        "cpus": os.cpu_count(),
        "kernel": os.uname().release,
        "samples": samples,
    }


def summary(run: dict[str, Any]) -> dict[str, dict[str, dict[str, float]]]:
    """Per side and measure: median and quartiles, and the median of the rounds' ratios to `fs`."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    fs = run["samples"]["fs"]
    for side, measures in run["samples"].items():
        for name, xs in measures.items():
            q = statistics.quantiles(xs, n=4)
            ratio = statistics.median(x / f for x, f in zip(xs, fs[name], strict=True))
            out.setdefault(side, {})[name] = {"median": statistics.median(xs), "p25": q[0], "p75": q[2], "vs_fs": ratio}
    return out


def plot(run: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stats = summary(run)
    mib = run["chunks"] * run["chunk_bytes"] // 2**20
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for ax, name, label in ((axes[0], "wall_ms", "wall ms per load"), (axes[1], "cpu_ms", "CPU ms per load")):
        medians = [stats[s][name]["median"] for s in SIDES]
        low = [stats[s][name]["median"] - stats[s][name]["p25"] for s in SIDES]
        high = [stats[s][name]["p75"] - stats[s][name]["median"] for s in SIDES]
        colors = ["#4a7fc1", "#2e7d32", "#1b5e20", "#81c784", "#66bb6a", "#0b3d10", "#999"]
        ax.bar(SIDES, medians, yerr=[low, high], capsize=4, color=colors)
        ax.set_ylabel(label)
        busy = f", {run.get('gil_busy', 0)} GIL holder" if run.get("gil_busy") else ""
        title = f"{label}: {run['chunks']} chunks, {mib} MiB{busy} ({run['rounds']} rounds, quartiles)"
        ax.set_title(title, fontsize=9)
        ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--chunks", type=int, default=64)
    parser.add_argument("--chunk-kib", type=int, default=1024)
    parser.add_argument("--gil-busy", type=int, default=0, help="threads holding the GIL (vLLM's scheduler)")
    parser.add_argument("--workdir", type=Path, default=None, help="where the files live (default: the temp dir)")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "kv_load_paths")
    args = parser.parse_args()
    if args.rounds < 2:
        parser.error("--rounds must be at least 2 (quartiles)")
    run = measure(args)
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "result.json").write_text(json.dumps(run, indent=1) + "\n")
    stats = summary(run)
    print(f"{run['chunks']} chunks of {run['chunk_bytes'] // 1024} KiB, {run['rounds']} rounds (median [quartiles])")
    for side in SIDES:
        wall, cpu = stats[side]["wall_ms"], stats[side]["cpu_ms"]
        rate = run["chunks"] * run["chunk_bytes"] / wall["median"] / 1e6
        print(
            f"  {side:9s} wall {wall['median']:6.1f} ms [{wall['p25']:.1f}-{wall['p75']:.1f}] {rate:5.2f} GB/s "
            f"{wall['vs_fs']:4.2f}x fs | CPU {cpu['median']:6.1f} ms [{cpu['p25']:.1f}-{cpu['p75']:.1f}] "
            f"{cpu['vs_fs']:4.2f}x fs"
        )
    plot(run, args.output / "load_paths.png")


if __name__ == "__main__":
    main()
