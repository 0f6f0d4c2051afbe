"""Throughput and latency of strata-kv against Debian's redis-server, side by side in one run.

Both servers run on loopback and are driven by the same client, Debian's `redis-benchmark`:
SET then GET of 64 KiB, 1 MiB and 4 MiB values at 1, 8 and 32 clients. The key space is sized so
every value fits in memory on both (strata-kv's L1 only by default; `--with-l2` adds a filesystem
L2 with write-behind to strata-kv, which Redis does not have). Absolute numbers on a shared 2-core
machine are noisy: read the ratios, and use `--repeat` (best of N runs, alternating servers).

    .venv/bin/python bench/kv_throughput.py [--sizes 65536,1048576,4194304] [--clients 1,8,32] [--markdown]
"""

from __future__ import annotations

import argparse
import csv
import io
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testsupport"))

from strata_testsupport.kvserver import running_kv_server, running_redis_server

MEMORY_BUDGET = 768 * 1024**2  # bytes of values per server


def requests_for(size: int) -> int:
    return max(200, min(20000, (3 * 1024**3) // size // 4))


def run_benchmark(binary: str, port: int, test: str, size: int, clients: int) -> dict[str, float]:
    keyspace = max(1, min(10000, MEMORY_BUDGET // size // 2))
    cmd = [binary, "-p", str(port), "-t", test, "-n", str(requests_for(size)), "-c", str(clients),
           "-d", str(size), "-r", str(keyspace), "--csv"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"redis-benchmark failed: {out.stderr[-500:]}")
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    row = next(r for r in rows if r["test"].upper() == test.upper())
    return {"rps": float(row["rps"]), "p50": float(row["p50_latency_ms"]), "p99": float(row["p99_latency_ms"])}


def human(size: int) -> str:
    return f"{size // 1024**2} MiB" if size >= 1024**2 else f"{size // 1024} KiB"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="65536,1048576,4194304")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--with-l2", action="store_true", help="give strata-kv a filesystem L2 (write-behind)")
    ap.add_argument("--repeat", type=int, default=1, help="best of N alternating runs (noisy shared machines)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    binary = shutil.which("redis-benchmark")
    if binary is None:
        sys.exit("redis-benchmark not found: apt-get install -y redis-tools")
    sizes = [int(s) for s in args.sizes.split(",")]
    clients = [int(c) for c in args.clients.split(",")]
    workdir = Path(tempfile.mkdtemp(prefix="strata-kv-bench-"))
    config = {"l1": {"size": "1GiB"}, "metrics": {"port": -1}, "limits": {"max_clients": 4096}}
    results: list[tuple[str, str, int, dict[str, float], dict[str, float]]] = []
    try:
        with (
            running_kv_server(workdir, config, l2_fs=args.with_l2) as kv,
            running_redis_server() as redis_srv,
        ):
            for size in sizes:
                for c in clients:
                    for test in ("SET", "GET"):
                        runs = [
                            (run_benchmark(binary, redis_srv.port, test, size, c),
                             run_benchmark(binary, kv.port, test, size, c))
                            for _ in range(args.repeat)
                        ]  # fmt: skip
                        r = max((x[0] for x in runs), key=lambda m: m["rps"])
                        s = max((x[1] for x in runs), key=lambda m: m["rps"])
                        results.append((test, human(size), c, s, r))
                        print(f"{test} {human(size)} c={c}: strata {s['rps']:.0f}/s redis {r['rps']:.0f}/s "
                              f"ratio {s['rps'] / r['rps']:.2f}", file=sys.stderr, flush=True)  # fmt: skip
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    head = ["op", "value", "clients", "strata req/s", "redis req/s", "ratio", "strata p50/p99 ms", "redis p50/p99 ms"]
    body = [
        [t, v, str(c), f"{s['rps']:.0f}", f"{r['rps']:.0f}", f"{s['rps'] / r['rps']:.2f}",
         f"{s['p50']:.2f}/{s['p99']:.2f}", f"{r['p50']:.2f}/{r['p99']:.2f}"]
        for t, v, c, s, r in results
    ]  # fmt: skip
    if args.markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in body:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(x) for x in col) for col in zip(head, *body, strict=True)]
        for row in [head, *body]:
            print("  ".join(x.ljust(w) for x, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    main()
