"""Fairness: how long one client's PING waits while another connection pipelines a flood of GETs.

One connection pipelines `--gets` GETs of a `--value-kib` value (sent from one thread, its replies
read as fast as they come from another, so its socket stays writable), while a second connection
sends one PING every `--interval-ms` and times each reply. Prints the PING latencies (p50, p99, max)
and how long the flood took. A server that never yields to other connections while one socket is
writable shows PING latencies close to the flood's duration.

    .venv/bin/python bench/kv_fairness.py [--gets 100000] [--value-kib 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import multiprocessing
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testsupport"))

from strata_testsupport.kvserver import running_kv_server


def command(*args: bytes) -> bytes:
    return b"*%d\r\n" % len(args) + b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in args)


def flood(port: int, gets: int, reply_size: int, done: Any, elapsed_out: Any) -> None:
    """Pipeline `gets` GETs and read every reply; reports the seconds until the last one arrived.

    Runs in its own process, so the PING client's timings do not include waits for this one's GIL.
    """
    sock = socket.create_connection(("127.0.0.1", port))
    request = command(b"GET", b"fair:value")
    started = time.perf_counter()

    def send() -> None:
        batch = request * 1000
        for _ in range(gets // 1000):
            sock.sendall(batch)
        sock.sendall(request * (gets % 1000))

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    expected, received = gets * reply_size, 0
    buf = bytearray(1 << 20)
    while received < expected:
        n = sock.recv_into(buf)
        if not n:
            raise RuntimeError(f"server closed the flooding connection after {received} of {expected} bytes")
        received += n
    elapsed_out.put(time.perf_counter() - started)
    done.set()
    sender.join()
    sock.close()


def pings(port: int, interval: float, done: Any, out: list[float]) -> None:
    """One PING at a time until the flood is over; appends each round trip in seconds."""
    sock = socket.create_connection(("127.0.0.1", port))
    while not done.is_set():
        started = time.perf_counter()
        sock.sendall(b"*1\r\n$4\r\nPING\r\n")
        reply = b""
        while not reply.endswith(b"\r\n"):
            reply += sock.recv(64)
        out.append(time.perf_counter() - started)
        time.sleep(interval)
    sock.close()


def run_once(port: int, args: argparse.Namespace, reply_size: int) -> tuple[list[float], float]:
    ctx = multiprocessing.get_context("spawn")
    done, elapsed = ctx.Event(), ctx.Queue()
    flooder = ctx.Process(target=flood, args=(port, args.gets, reply_size, done, elapsed))
    flooder.start()
    time.sleep(0.2)  # the flood is under way before the first PING
    latencies: list[float] = []
    pings(port, args.interval_ms / 1000, done, latencies)
    flooder.join()
    return latencies, float(elapsed.get())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gets", type=int, default=100_000)
    ap.add_argument("--value-kib", type=int, default=8)
    ap.add_argument("--interval-ms", type=float, default=5.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    value = b"v" * (args.value_kib * 1024)
    reply_size = len(b"$%d\r\n" % len(value)) + len(value) + 2
    with tempfile.TemporaryDirectory(prefix="strata-kv-fair-") as tmp:
        config = {"metrics": {"port": -1}, "l1": {"size": "256MiB"}}
        with running_kv_server(Path(tmp), config, l2_fs=False) as server:
            r = server.redis()
            r.set("fair:value", value)
            r.close()
            for i in range(args.repeat):
                latencies, elapsed = run_once(server.port, args, reply_size)
                ms = [x * 1000 for x in latencies]
                print(
                    f"run {i + 1}: flood of {args.gets} GETs ({args.value_kib} KiB) took {elapsed:.2f} s; "
                    f"other client's PING over {len(ms)} samples: p50 {statistics.median(ms):.2f} ms, "
                    f"p99 {percentile(ms, 0.99):.2f} ms, max {max(ms):.2f} ms",
                    flush=True,
                )


if __name__ == "__main__":
    main()
