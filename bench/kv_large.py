"""Large values (4-64 MiB): strata-kv against redis-server in one run, with a client that is not the bottleneck.

redis-benchmark tops out below 1 GB/s here, so this drives both servers with its own load generator:
raw RESP over blocking sockets, one thread per connection spread over a few processes, every value
sent from one preallocated buffer (`sendall` of a memoryview) and every reply received with
`recv_into` into another, so the client copies nothing in Python. Its own ceiling is measured first, SET and
GET, against the cheapest server there is (`null_server.c`, C, compiled on first use), and then the ceiling of any
store: the same server keeping the bench's key space, each SET received in place into its key's slot.

Cells: value size x (SET, GET) x client count, over TCP (and, with `--unix`, over a Unix socket next
to this machine's memcpy bandwidth, and Strata's GETs once more as `unix-shm`: `STRATA.GETFD` with
`listen.shared_memory`, the value's memory handed over and copied once into the client's buffer).
The key space is filled before the GETs, so every GET is a hit; SETs overwrite keys of the same key
space, so both servers hold the same bytes throughout. Peak RSS per cell comes from /proc (VmHWM, reset
before each cell through clear_refs), and so does each server's CPU time per GB moved (utime + stime of all
its threads; the null server's is what the kernel's side alone costs). Servers run one at a time,
alternating per value size.

    .venv/bin/python bench/kv_large.py [--sizes 4,16,64] [--clients 1,8,32] [--seconds 3] [--unix]
        [--json bench/results/kv_large.json] [--png bench/results/kv_large.png] [--markdown] [--probe]
    .venv/bin/python bench/kv_large.py --report bench/results/kv_large.json [--png ...]   # from a saved run
    .venv/bin/python bench/kv_large.py --interleave 6 --sizes 4 --clients 1,8 [--pin] [--probe]
        [--strata-b listen.sender_threads=2 | --strata-b '' --strata-b-pythonpath ../other/kvserver]

`--interleave` is for the cells where the machine's state moves more than the servers differ (4 MiB at one
client): every server runs at once and each cell is run round after round with the servers back to back, so each
round's ratio compares them under one machine state; `--strata-b` adds a second Strata for an A/B of a setting
or of another checkout's server.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import hashlib
import json
import math
import mmap
import multiprocessing as mp
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testsupport"))

from strata_kv.wire.shared_memory import get_shared_into
from strata_testsupport.kvserver import running_kv_server, running_redis_server

MiB = 1024**2
Address = tuple[str, int] | str  # (host, port), a Unix socket path, or SHM + path: GETs take the value's memory
SHM = "shm:"


# -- the load generator ----------------------------------------------------------------------------
def _connect(addr: Address) -> socket.socket:
    if isinstance(addr, str):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(addr.removeprefix(SHM))
    else:
        s = socket.create_connection(addr)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def _read_line(s: socket.socket, buf: bytearray) -> bytes:
    """One reply line; replies here are tiny headers, read byte-exactly so the value lands in `recv_into`."""
    buf.clear()
    while not buf.endswith(b"\r\n"):
        chunk = s.recv(1)
        if not chunk:
            raise ConnectionError("server closed the connection")
        buf += chunk
    return bytes(buf)


def _recv_exact(s: socket.socket, view: memoryview) -> None:
    while view:
        n = s.recv_into(view)
        if n == 0:
            raise ConnectionError("server closed the connection")
        view = view[n:]


def _key(i: int) -> bytes:
    return b"bench:%08d" % i


def _set(s: socket.socket, key: bytes, value: memoryview, line: bytearray) -> None:
    s.sendall(b"*3\r\n$3\r\nSET\r\n$%d\r\n%b\r\n$%d\r\n" % (len(key), key, len(value)))
    s.sendall(value)
    s.sendall(b"\r\n")
    reply = _read_line(s, line)
    if reply != b"+OK\r\n":
        raise RuntimeError(f"SET failed: {reply[:200]!r}")


def _get(s: socket.socket, key: bytes, into: memoryview, line: bytearray) -> None:
    s.sendall(b"*2\r\n$3\r\nGET\r\n$%d\r\n%b\r\n" % (len(key), key))
    head = _read_line(s, line)
    if not head.startswith(b"$") or int(head[1:-2]) != len(into) - 2:
        raise RuntimeError(f"GET is not a hit of the expected size: {head[:200]!r}")
    _recv_exact(s, into)


def _get_shared(s: socket.socket, key: bytes, into: memoryview) -> None:
    """STRATA.GETFD with the project's client function: one copy from the handed-over memory into `into`."""
    if not get_shared_into(s, key, into[:-2]):
        raise RuntimeError("GETFD missed: the key space was filled first")


def page_aligned(content: int | bytes) -> memoryview:
    """A page-aligned buffer (of that size, or holding those bytes), as an engine's CPU tier is (vLLM maps it
    from /dev/shm): the kernel copies into or out of a buffer 16 bytes past a page (a bytearray of 32 MiB or more)
    at about a third of the speed here, for every server alike, which would measure the buffer, not the server."""
    size = content if isinstance(content, int) else len(content)
    view = memoryview(mmap.mmap(-1, size))
    if not isinstance(content, int):
        view[:] = content
    return view


def touched(size: int) -> memoryview:
    """A page-aligned buffer with every page already faulted in, as an engine's preallocated CPU tier is."""
    view = page_aligned(size)
    ctypes.memset(ctypes.addressof(ctypes.c_char.from_buffer(view)), 0, size)
    return view


def client_buffer(op: str, size: int) -> memoryview:
    """What one connection sends (SET: the value) or receives into (GET: the value and its CRLF), ready to use.

    Made before the clock starts: at 64 MiB x32 building and faulting in the buffers inside the timed window
    took a third of it, so every server, and the client's own ceiling, measured page faults."""
    return page_aligned(bytes(os.urandom(64)) * (size // 64)) if op == "SET" else touched(size + 2)


def _client_thread(addr: Address, op: str, buffer: memoryview, keys: int, deadline: float, seed: int, out: list[Any]
                   ) -> None:  # fmt: skip
    rng = random.Random(seed)
    shared = isinstance(addr, str) and addr.startswith(SHM)
    line = bytearray()
    lat: list[float] = []
    try:
        with _connect(addr) as s:
            while time.perf_counter() < deadline:
                key = _key(rng.randrange(keys))
                t = time.perf_counter()
                if op == "SET":
                    _set(s, key, buffer, line)
                elif shared:
                    _get_shared(s, key, buffer)
                else:
                    _get(s, key, buffer, line)
                lat.append(time.perf_counter() - t)
    except (OSError, RuntimeError) as e:
        out.append(e)
    out.append(lat)


def _client_process(addr: Address, op: str, size: int, keys: int, threads: int, ready: Any, seconds: float,
                    seed: int, results: Any) -> None:  # fmt: skip
    buffers = [client_buffer(op, size) for _ in range(threads)]
    ready.wait()  # every process starts together, its buffers made
    deadline = time.perf_counter() + seconds
    out: list[Any] = []
    workers = [threading.Thread(target=_client_thread, args=(addr, op, buffers[i], keys, deadline, seed * 1000 + i,
                                                             out)) for i in range(threads)]  # fmt: skip
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    errors = [str(e)[:120] for e in out if isinstance(e, Exception)]
    results.put(([x for lat in out if isinstance(lat, list) for x in lat], errors))


PROBE_KEY = b"probe:small"


def _probe(addr: Address, start: float, seconds: float, out: list[float]) -> None:
    """A small GET every 5 ms on a connection of its own, while the load runs: what the load costs others."""
    time.sleep(max(0.0, start - time.time()))
    into = memoryview(bytearray(100 + 2))
    line = bytearray()
    deadline = time.perf_counter() + seconds
    with _connect(addr) as s:
        while time.perf_counter() < deadline:
            t = time.perf_counter()
            _get(s, PROBE_KEY, into, line)
            out.append(time.perf_counter() - t)
            time.sleep(0.005)


def load(addr: Address, op: str, size: int, keys: int, clients: int, seconds: float, probe: bool = False
         ) -> dict[str, Any]:  # fmt: skip
    """Run `clients` connections for `seconds`; GB/s (1e9 bytes of values per second) and latency percentiles."""
    procs = min(clients, 2)
    ctx = mp.get_context("fork")
    results = ctx.Queue()
    ready = ctx.Barrier(procs + 1)
    ps = []
    for i in range(procs):
        threads = clients // procs + (1 if i < clients % procs else 0)
        ps.append(ctx.Process(target=_client_process, args=(addr, op, size, keys, threads, ready, seconds, i, results)))
    for p in ps:
        p.start()
    ready.wait(timeout=600)
    start = time.time()
    probe_lat: list[float] = []
    prober = threading.Thread(target=_probe, args=(addr, start, seconds, probe_lat)) if probe else None
    if prober is not None:
        prober.start()
    lat: list[float] = []
    errors: list[str] = []
    for _ in ps:
        got, errs = results.get(timeout=seconds + 600)
        lat.extend(got)
        errors.extend(errs)
    elapsed = max(seconds, time.time() - start)  # a request begun before the deadline counts in full
    if prober is not None:
        prober.join()
    probe_lat.sort()
    probe_p99 = probe_lat[min(len(probe_lat) - 1, int(len(probe_lat) * 0.99))] * 1e3 if probe_lat else float("nan")
    for p in ps:
        p.join()
    lat.sort()
    n = len(lat)
    if n == 0:
        return {"gbps": 0.0, "requests": 0, "p50_ms": float("nan"), "p99_ms": float("nan"), "errors": errors}
    return {
        "probe_p99_ms": probe_p99,
        "errors": errors,
        "gbps": n * size / elapsed / 1e9,
        "requests": n,
        "p50_ms": lat[n // 2] * 1e3,
        "p99_ms": lat[min(n - 1, int(n * 0.99))] * 1e3,
    }


def prime(addr: Address, size: int, keys: int) -> None:
    """Every key SET once and the probe's small key too: what a server holds before its first cell."""
    fill(addr, size, keys)
    with _connect(addr) as s:
        _set(s, PROBE_KEY, memoryview(b"p" * 100), bytearray())


def fill(addr: Address, size: int, keys: int) -> None:
    """SET every key once (parallel over 4 connections) so GETs are hits."""
    value = memoryview(bytearray(os.urandom(64)) * (size // 64))

    def part(first: int) -> None:
        line = bytearray()
        with _connect(addr) as s:
            for i in range(first, keys, 4):
                _set(s, _key(i), value, line)

    threads = [threading.Thread(target=part, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


# -- measuring the servers ---------------------------------------------------------------------------
def reset_peak(pid: int) -> None:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of all of `pid`'s threads so far (/proc/<pid>/stat utime + stime)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_ms_per_gb(pid: int, since: float, cell: dict[str, Any], size: int) -> float:
    """The server's CPU time per GB of values the cell moved: what it leaves to the rest of a busy node, and less at
    the mercy of other work on the machine than GB/s (it still varies: the kernel's copies slow down too)."""
    moved = cell["requests"] * size / 1e9
    return (cpu_seconds(pid) - since) * 1e3 / moved if moved else math.nan


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


NULL_SERVER_SOURCE = Path(__file__).with_name("null_server.c")
CACHE = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "strata" / "bench"


def null_server_binary() -> Path:
    """`null_server.c` compiled once per source version (gcc), cached outside the repository."""
    source = NULL_SERVER_SOURCE.read_bytes()
    binary = CACHE / f"null-server-{hashlib.sha256(source).hexdigest()[:12]}"
    if not binary.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        partial = binary.with_suffix(".partial")
        subprocess.run(["gcc", "-O2", "-pthread", "-o", str(partial), str(NULL_SERVER_SOURCE)], check=True)
        partial.rename(binary)
    return binary


@contextlib.contextmanager
def null_server(size: int, keys: int = 0) -> Iterator[tuple[int, Address]]:
    """The cheapest server (`null_server.c`): GETs answered from one preallocated reply, SET values received into
    a reused buffer and dropped. What the load generator reaches against it is its own ceiling.

    With `keys`, the cheapest store instead: one slot per key of the bench's key space, a SET received in place
    into its key's slot, a GET sent from it. Its memory is as large and as cold in the caches as a real server's
    key space, and it copies each value once, but allocates, indexes and guards nothing: no server can beat it,
    so a cell where it is not 1.2x Redis is one where 1.2x Redis cannot be had on this machine."""
    argv = [str(null_server_binary()), str(size)] + ([str(keys)] if keys else [])
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        if not line.startswith("port "):
            raise RuntimeError(f"null_server did not start: {line!r}")
        yield proc.pid, ("127.0.0.1", int(line.split()[1]))
    finally:
        proc.kill()
        proc.wait()


def memcpy_gbps(size: int = 64 * MiB, repeat: int = 10) -> float:
    """One thread copying between two touched buffers: this machine's memcpy bandwidth (best of `repeat`)."""
    import numpy as np

    src = np.ones(size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t)
    return size / best / 1e9


def keys_for(size: int, budget: int) -> int:
    return max(4, budget // size)


@contextlib.contextmanager
def strata(workdir: Path, l1: int, extra: dict[str, Any], pythonpath: str | None = None
           ) -> Iterator[tuple[int, Address, Address]]:  # fmt: skip
    """A strata-kv server with L1 only and `extra` settings; with `pythonpath`, the server of another checkout
    (its `kvserver` directory), for an A/B of a change."""
    config: dict[str, Any] = {"l1": {"size": l1}, "metrics": {"port": -1}}
    for dotted, value in extra.items():  # e.g. listen.event_loop=uvloop
        node = config
        *path, leaf = dotted.split(".")
        for p in path:
            node = node.setdefault(p, {})
        node[leaf] = value
    env = {"PYTHONPATH": pythonpath} if pythonpath else None
    with running_kv_server(workdir, config, l2_fs=False, env=env) as srv:
        assert srv.process is not None and srv.unix_socket
        yield srv.process.pid, ("127.0.0.1", srv.port), srv.unix_socket


@contextlib.contextmanager
def redis(workdir: Path, l1: int) -> Iterator[tuple[int, Address, Address]]:
    sock = str(workdir / "redis.sock")
    extra = ["--unixsocket", sock, "--unixsocketperm", "600", "--maxmemory-policy", "allkeys-lru"]
    with running_redis_server(maxmemory=str(l1), extra_args=extra) as r:
        yield r.process.pid, ("127.0.0.1", r.port), sock


def run_cells(name: str, server: Any, size: int, keys: int, clients: list[int], seconds: float, unix: bool,
              ops: list[str], probe: bool = False) -> list[dict[str, Any]]:  # fmt: skip
    rows = []
    with server as (pid, tcp, uds):
        reset_peak(pid)
        prime(tcp, size, keys)
        transports: list[tuple[str, Address]] = [("tcp", tcp)] + ([("unix", uds)] if unix else [])
        if unix and name == "strata":
            transports.append(("unix-shm", SHM + str(uds)))  # GETs only: SETs are the plain socket's
        for transport, addr in transports:
            for op in ops if transport != "unix-shm" else [o for o in ops if o == "GET"]:
                if op == "GET":
                    fill(tcp, size, keys)  # SETs under load may have evicted keys (both servers are caches)
                for c in clients:
                    reset_peak(pid)
                    cpu = cpu_seconds(pid)
                    r = load(addr, op, size, keys, c, seconds, probe)
                    r.update(server=name, transport=transport, op=op, size_mib=size // MiB, clients=c,
                             peak_rss=peak_rss(pid), cpu_ms_per_gb=cpu_ms_per_gb(pid, cpu, r, size))  # fmt: skip
                    if r["errors"]:
                        print(f"  {len(r['errors'])} client errors, e.g. {r['errors'][0]}", flush=True)
                    print(f"  {name:6} {transport:4} {op} {size // MiB:3} MiB x{c:<3} {r['gbps']:6.2f} GB/s  "
                          f"p50 {r['p50_ms']:7.1f} ms  p99 {r['p99_ms']:7.1f} ms  peak RSS "
                          f"{r['peak_rss'] / 1e9:5.2f} GB  server CPU {r['cpu_ms_per_gb']:5.0f} ms/GB",
                          flush=True)  # fmt: skip
                    if probe:
                        print(
                            f"    small GET on another connection meanwhile: p99 {r['probe_p99_ms']:.1f} ms", flush=True
                        )
                    rows.append(r)
    return rows


def _pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` onto `cpus` (threads made later inherit it from theirs)."""
    for task in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(task), cpus)


def interleave(args: argparse.Namespace, extra: dict[str, Any], extra_b: dict[str, Any] | None) -> dict[str, Any]:
    """Every server up at once, each cell run `args.interleave` times, the servers back to back within a round
    (their order reversed every other round): each round's ratio pairs them under one machine state.

    Separate runs put minutes between the servers, and on this shared machine one cell's GB/s moves 2x in
    minutes at one client, more than the differences sought. The servers: the store's ceiling (`null_server`
    keeping the key space), Strata, Redis, and with `--strata-b` a second Strata (other settings, or with
    `--strata-b-pythonpath` another checkout's server). With `--pin`, servers run on the last CPU and the clients
    on the others, so no round depends on where the scheduler put them."""
    cells: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kv-large-") as tmp:
        for size in [int(v) * MiB for v in args.sizes.split(",")]:
            cells.extend(_interleave_size(args, size, Path(tmp), extra, extra_b))  # one size's servers at a time
    return {"interleaved": cells, "pinned": bool(args.pin), "loadavg_after": os.getloadavg(), "strata": extra,
            "strata_b": extra_b, "strata_b_pythonpath": args.strata_b_pythonpath}  # fmt: skip


def _interleave_size(args: argparse.Namespace, size: int, tmp: Path, extra: dict[str, Any],
                     extra_b: dict[str, Any] | None) -> list[dict[str, Any]]:  # fmt: skip
    l1, keys, cpus = int(args.l1), keys_for(size, args.keyspace), sorted(os.sched_getaffinity(0))
    cells = []
    with contextlib.ExitStack() as stack:
        servers: dict[str, tuple[int, Address]] = {"store": stack.enter_context(null_server(size, keys))}
        for name, settings, path in (("strata", extra, None), ("strata-b", extra_b, args.strata_b_pythonpath)):
            if settings is not None:
                pid, tcp, _ = stack.enter_context(strata(tmp / f"{name}{size}", l1, settings, path))
                servers[name] = (pid, tcp)
        pid, tcp, _ = stack.enter_context(redis(tmp, l1))
        servers["redis"] = (pid, tcp)
        for name, (_, addr) in servers.items():
            if name != "store":  # its key space is there from the start, and it answers the probe itself
                prime(addr, size, keys)
        if args.pin:
            os.sched_setaffinity(0, set(cpus[:-1]))  # the client processes fork from here
        for op in args.ops.split(","):
            for c in [int(c) for c in args.clients.split(",")]:
                for n in range(args.interleave):
                    for name in list(servers)[:: -1 if n % 2 else 1]:
                        pid, addr = servers[name]
                        if args.pin:
                            _pin(pid, {cpus[-1]})
                        cpu = cpu_seconds(pid)
                        r = load(addr, op, size, keys, c, args.seconds, args.probe)
                        r.update(server=name, round=n, op=op, size_mib=size // MiB, clients=c,
                                 cpu_ms_per_gb=cpu_ms_per_gb(pid, cpu, r, size))  # fmt: skip
                        cells.append(r)
                        print(f"  round {n} {name:8} {op} {size // MiB:3} MiB x{c:<3} {r['gbps']:6.2f} GB/s  "
                              f"server CPU {r['cpu_ms_per_gb']:5.0f} ms/GB  small GET p99 "
                              f"{r.get('probe_p99_ms', math.nan):.1f} ms", flush=True)  # fmt: skip
        if args.pin:
            os.sched_setaffinity(0, set(cpus))
    return cells


def interleaved_table(cells: list[dict[str, Any]]) -> str:
    """Per cell and server: median GB/s, the median and range of the rounds' own ratios over Redis, median CPU per
    GB and small-GET p99."""
    groups: dict[tuple[str, int, int], dict[str, list[dict[str, Any]]]] = {}
    for r in cells:
        groups.setdefault((r["op"], r["size_mib"], r["clients"]), {}).setdefault(r["server"], []).append(r)
    out = ["| value | op | clients | server | GB/s | over Redis, per round | server CPU ms/GB | small GET p99 ms |",
           "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (op, size, c), by in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0] != "SET", kv[0][2])):
        redis_gbps = {r["round"]: r["gbps"] for r in by.get("redis", [])}
        for name, rounds in by.items():
            ratios = [r["gbps"] / redis_gbps[r["round"]] for r in rounds if redis_gbps.get(r["round"])]
            spread = f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-"
            p99 = [r["probe_p99_ms"] for r in rounds if not math.isnan(r.get("probe_p99_ms", math.nan))]
            out.append(f"| {size} MiB | {op} | {c} | {name} | {statistics.median(r['gbps'] for r in rounds):.2f} | "
                       f"{spread} | {statistics.median(r['cpu_ms_per_gb'] for r in rounds):.0f} | "
                       f"{f'{statistics.median(p99):.1f}' if p99 else '-'} |")  # fmt: skip
    return "\n".join(out)


def table(rows: list[dict[str, Any]], transport: str, ceiling: list[dict[str, Any]] | None = None,
          store: list[dict[str, Any]] | None = None) -> str:  # fmt: skip
    """Strata next to Redis per cell; over TCP also the client's ceiling (the null server) for the same cell, the
    store's ceiling (the null server keeping a key space) over Redis where the run measured it, and with `--probe`
    the small GET's p99 on each server and on the null server (the machine's own floor), and where the runs
    measured it each server's CPU time per GB moved (the null server's: what the kernel alone costs)."""
    by = {(r["server"], r["transport"], r["op"], r["size_mib"], r["clients"]): r for r in rows}
    limits = {(r["op"], r["size_mib"], r["clients"]): r for r in ceiling or []} if transport == "tcp" else {}
    stores = {(r["op"], r["size_mib"], r["clients"]): r for r in store or []} if transport == "tcp" else {}
    probed = any(not math.isnan(r.get("probe_p99_ms", math.nan)) for r in rows)
    head = "| value | op | clients | Strata GB/s | Redis GB/s | ratio |"
    head += " client ceiling GB/s |" if limits else ""
    head += " store ceiling GB/s (over Redis) |" if stores else ""
    head += " p99 Strata ms | p99 Redis ms | peak RSS Strata GB | peak RSS Redis GB |"
    cpu = all("cpu_ms_per_gb" in r for r in rows)
    head += (" server CPU ms/GB Strata / Redis" + (" / null" if limits else "") + " |") if cpu else ""
    head += (" small GET p99 Strata / Redis" + (" / null" if limits else "") + " ms |") if probed else ""
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for (server, tr, op, size, c), s in sorted(by.items(), key=lambda kv: (kv[0][3], kv[0][2] != "SET", kv[0][4])):
        if server != "strata" or tr != transport:
            continue
        r = by.get(("redis", tr, op, size, c))
        if r is None:
            continue
        line = f"| {size} MiB | {op} | {c} | {_gbps(s)} | {_gbps(r)} | {_ratio(s, r)} |"
        limit = limits.get((op, size, c))
        if limits:
            line += f" {limit['gbps']:.2f} |" if limit else " - |"
        if stores:
            best = stores.get((op, size, c))
            line += f" {_gbps(best)} ({_ratio(best, r)}) |" if best else " - |"
        line += f" {s['p99_ms']:.1f} | {r['p99_ms']:.1f} | {s['peak_rss'] / 1e9:.2f} | {r['peak_rss'] / 1e9:.2f} |"
        if cpu:
            floor = ""
            if limits:
                floor = f" / {limit['cpu_ms_per_gb']:.0f}" if limit and "cpu_ms_per_gb" in limit else " / -"
            line += f" {s['cpu_ms_per_gb']:.0f} / {r['cpu_ms_per_gb']:.0f}{floor} |"
        if probed:
            floor = (f" / {limit['probe_p99_ms']:.1f}" if limit else " / -") if limits else ""
            line += f" {s['probe_p99_ms']:.1f} / {r['probe_p99_ms']:.1f}{floor} |"
        out.append(line)
    return "\n".join(out)


def _gbps(cell: dict[str, Any]) -> str:
    """GB/s, with the range over the runs where several were merged."""
    runs = cell.get("gbps_runs", [])
    spread = f" ({min(runs):.2f}-{max(runs):.2f})" if len(runs) > 1 else ""
    return f"{cell['gbps']:.2f}{spread}"


def _ratio(strata: dict[str, Any], redis: dict[str, Any]) -> str:
    """Strata's GB/s over Redis' (the medians'), and where several runs were merged the range of the runs' own
    ratios: both servers ran minutes apart within each run, so a run's ratio pairs them under one machine state,
    where the two medians may come from different runs."""
    ratio = strata["gbps"] / redis["gbps"] if redis["gbps"] else math.inf
    mine, theirs = strata.get("gbps_runs", []), redis.get("gbps_runs", [])
    paired = [a / b for a, b in zip(mine, theirs, strict=True) if b] if len(mine) == len(theirs) > 1 else []
    spread = f" ({min(paired):.2f}-{max(paired):.2f})" if paired else ""
    return f"{ratio:.2f}x{spread}"


def shared_table(rows: list[dict[str, Any]], memcpy: float) -> str:
    """Strata's GETs over the Unix socket, bytes vs memory handed over, next to memcpy measured in the same run."""
    mine = [r for r in rows if r["server"] == "strata" and r["op"] == "GET"]
    by = {(r["transport"], r["size_mib"], r["clients"]): r for r in mine}
    out = ["| value | clients | Unix socket GB/s | shared memory GB/s | memcpy GB/s | socket / memcpy | "
           "shared / memcpy | p99 socket ms | p99 shared ms |",
           "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for (tr, size, c), shm in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        plain = by.get(("unix", size, c))
        if tr != "unix-shm" or plain is None:
            continue
        out.append(f"| {size} MiB | {c} | {plain['gbps']:.2f} | {shm['gbps']:.2f} | {memcpy:.2f} | "
                   f"{plain['gbps'] / memcpy:.2f}x | {shm['gbps'] / memcpy:.2f}x | {plain['p99_ms']:.1f} | "
                   f"{shm['p99_ms']:.1f} |")  # fmt: skip
    return "\n".join(out)


def compare(before: Path, after: Path) -> str:
    """A before/after table from two `--json` results (TCP cells)."""

    def cells(path: Path) -> dict[tuple[str, str, int, int], dict[str, Any]]:
        rows = json.loads(path.read_text())["cells"]
        return {(r["server"], r["op"], r["size_mib"], r["clients"]): r for r in rows if r["transport"] == "tcp"}

    b, a = cells(before), cells(after)
    out = ["| value | op | clients | before: Strata / Redis GB/s (ratio) | after: Strata / Redis GB/s (ratio) | "
           "after p99 Strata / Redis ms | after peak RSS Strata / Redis GB |",
           "|---|---|---|---|---|---|---|"]  # fmt: skip

    def pair(d: dict[tuple[str, str, int, int], dict[str, Any]], op: str, size: int, c: int) -> str:
        s, r = d.get(("strata", op, size, c)), d.get(("redis", op, size, c))
        if not s or not r:
            return "-"
        return f"{s['gbps']:.2f} / {r['gbps']:.2f} ({s['gbps'] / r['gbps'] if r['gbps'] else float('inf'):.2f}x)"

    for size, op, c in sorted({(k[2], k[1], k[3]) for k in a}, key=lambda t: (t[0], t[1] != "SET", t[2])):
        s, r = a.get(("strata", op, size, c)), a.get(("redis", op, size, c))
        p99 = f"{s['p99_ms']:.0f} / {r['p99_ms']:.0f}" if s and r else "-"
        rss = f"{s['peak_rss'] / 1e9:.2f} / {r['peak_rss'] / 1e9:.2f}" if s and r else "-"
        out.append(f"| {size} MiB | {op} | {c} | {pair(b, op, size, c)} | {pair(a, op, size, c)} | {p99} | {rss} |")
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: Path, ceiling: list[dict[str, Any]], store: list[dict[str, Any]]
         ) -> None:  # fmt: skip
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tcp = [r for r in rows if r["transport"] == "tcp"]
    clients = sorted({r["clients"] for r in tcp})
    fig, axes = plt.subplots(2, len(clients), figsize=(4 * len(clients), 7), squeeze=False, sharey="row")
    for i, op in enumerate(("SET", "GET")):
        for j, c in enumerate(clients):
            ax = axes[i][j]
            for server, style in (("strata", "o-"), ("redis", "s--")):
                pts = sorted((r["size_mib"], r["gbps"]) for r in tcp if r["server"] == server and r["op"] == op
                             and r["clients"] == c)  # fmt: skip
                if pts:
                    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=server)
            for bound, style, label in ((ceiling, ":", "client ceiling"), (store, "-.", "store ceiling")):
                limit = sorted((r["size_mib"], r["gbps"]) for r in bound if r.get("op") == op and r["clients"] == c)
                if limit:
                    ax.plot([p[0] for p in limit], [p[1] for p in limit], style, color="gray", label=label)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{op}, {c} client{'s' if c > 1 else ''}")
            ax.set_xlabel("value size (MiB)")
            if j == 0:
                ax.set_ylabel("GB/s")
            ax.grid(True, alpha=0.3)
            ax.legend()
    fig.suptitle("strata-kv vs redis-server, TCP loopback, hits only")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", default="4,16,64", help="value sizes in MiB")
    ap.add_argument("--clients", default="1,8,32")
    ap.add_argument("--seconds", type=float, default=3.0, help="per cell")
    ap.add_argument("--l1", default=str(3 * 1024**3), help="Strata's L1 size and Redis' maxmemory, in bytes")
    ap.add_argument("--keyspace", type=int, default=512 * MiB, help="bytes of values in the key space")
    ap.add_argument("--unix", action="store_true", help="also measure over a Unix socket")
    ap.add_argument("--strata-set", action="append", default=[], metavar="KEY=VALUE",
                    help="extra strata-kv config, dotted (e.g. listen.event_loop=asyncio)")  # fmt: skip
    ap.add_argument("--only", choices=("strata", "redis"), help="one server only")
    ap.add_argument("--probe", action="store_true", help="also time a small GET every 5 ms on another connection")
    ap.add_argument("--ops", default="SET,GET", help="SET alone with a key space larger than L1: the memory bound")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--compare", nargs=2, type=Path, metavar=("BEFORE", "AFTER"), help="print a table, run nothing")
    ap.add_argument("--interleave", type=int, metavar="ROUNDS",
                    help="all servers up, each cell run ROUNDS times with the servers back to back")  # fmt: skip
    ap.add_argument("--strata-b", action="append", metavar="KEY=VALUE",
                    help="with --interleave: a second Strata with these settings ('' for none)")  # fmt: skip
    ap.add_argument("--strata-b-pythonpath", metavar="DIR",
                    help="the second Strata from another checkout's kvserver/")  # fmt: skip
    ap.add_argument("--pin", action="store_true",
                    help="with --interleave: servers on the last CPU, clients on the rest")  # fmt: skip
    ap.add_argument("--report", type=Path, nargs="+", metavar="JSON",
                    help="tables (and --png) of saved --json runs, each cell their median; run nothing")  # fmt: skip
    args = ap.parse_args()
    if args.compare:
        print(compare(*args.compare))
        return
    if args.report:
        report(merge_runs([json.loads(path.read_text()) for path in args.report]), args.png, True)
        return
    sizes = [int(s) * MiB for s in args.sizes.split(",")]
    ops = args.ops.split(",")
    clients = [int(c) for c in args.clients.split(",")]
    l1 = int(args.l1)
    extra = settings(args.strata_set)
    if args.unix:
        extra.setdefault("listen.shared_memory", True)  # GETs over unix-shm take the value's memory
    if args.pin and len(os.sched_getaffinity(0)) < 2:
        ap.error("--pin needs at least 2 CPUs: one for the servers, the rest for the clients")
    if args.interleave:
        extra_b = None if args.strata_b is None else settings([kv for kv in args.strata_b if kv])
        rounds = interleave(args, extra, extra_b)
        if args.json:
            args.json.parent.mkdir(parents=True, exist_ok=True)
            args.json.write_text(json.dumps(rounds, indent=1))
        print("\n" + interleaved_table(rounds["interleaved"]))
        return
    load1 = os.getloadavg()
    result: dict[str, Any] = {"machine": {"cpus": os.cpu_count(), "loadavg_before": load1}, "l1_bytes": l1}
    result["memcpy_gbps"] = memcpy_gbps()
    print(f"memcpy (one thread, 64 MiB, touched buffers): {result['memcpy_gbps']:.1f} GB/s", flush=True)
    result["client_ceiling"], result["store_ceiling"] = [], []
    for size in sizes:
        for what, keys in (("client_ceiling", 0), ("store_ceiling", keys_for(size, args.keyspace))):
            with null_server(size, keys) as (pid, addr):
                for op in ops:
                    for c in clients:
                        cpu = cpu_seconds(pid)
                        r = load(addr, op, size, keys or 1, c, min(args.seconds, 2.0), args.probe)
                        r.update(op=op, size_mib=size // MiB, clients=c,
                                 cpu_ms_per_gb=cpu_ms_per_gb(pid, cpu, r, size))  # fmt: skip
                        result[what].append(r)
                        probe = f"  small GET p99 {r['probe_p99_ms']:.1f} ms" if args.probe else ""
                        print(f"  {what.replace('_', ' '):14} {op} {size // MiB:3} MiB x{c:<3} {r['gbps']:6.2f} GB/s  "
                              f"server CPU {r['cpu_ms_per_gb']:5.0f} ms/GB{probe}", flush=True)  # fmt: skip
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="kv-large-") as tmp:
        for n, size in enumerate(sizes):
            keys = keys_for(size, args.keyspace)
            order = [("strata", strata(Path(tmp) / f"s{n}", l1, extra)), ("redis", redis(Path(tmp), l1))]
            if n % 2:
                order.reverse()
            for name, server in order:
                if args.only and name != args.only:
                    continue
                rows.extend(run_cells(name, server, size, keys, clients, args.seconds, args.unix, ops, args.probe))
    result["cells"] = rows
    result["machine"]["loadavg_after"] = os.getloadavg()
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=1))
    report(result, args.png, args.markdown)


def settings(pairs: list[str]) -> dict[str, Any]:
    """`--strata-set` pairs (dotted KEY=VALUE) as a dict, digits as numbers."""
    return {k: (int(v) if v.isdigit() else v) for k, v in (kv.split("=", 1) for kv in pairs)}


def merge_runs(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of the same matrix as one: each cell's GB/s, p50, p99 and small-GET p99 the median over the
    runs (`gbps_runs` keeps every run's GB/s), its peak RSS the highest. On a machine shared with other work one
    run's cell can be off by 2-4x, so a table worth reading takes more than one run."""
    if len(runs) == 1:
        return runs[0]

    def merged(cells: list[list[dict[str, Any]]], key: tuple[str, ...]) -> list[dict[str, Any]]:
        groups: dict[tuple[Any, ...], list[dict[str, Any]]] = {}
        for run in cells:
            for cell in run:
                groups.setdefault(tuple(cell.get(k) for k in key), []).append(cell)
        out = []
        for group in groups.values():
            cell = dict(group[0])
            for field in ("gbps", "p50_ms", "p99_ms", "probe_p99_ms", "cpu_ms_per_gb"):
                if all(field in c for c in group):
                    cell[field] = statistics.median(c[field] for c in group)
            if all("peak_rss" in c for c in group):
                cell["peak_rss"] = max(c["peak_rss"] for c in group)
            cell["gbps_runs"] = [c["gbps"] for c in group]
            out.append(cell)
        return out

    return {
        "runs": len(runs),
        "machine": [run["machine"] for run in runs],
        "memcpy_gbps": statistics.median(run["memcpy_gbps"] for run in runs),
        "client_ceiling": merged([run["client_ceiling"] for run in runs], ("op", "size_mib", "clients")),
        "store_ceiling": merged([run.get("store_ceiling", []) for run in runs], ("op", "size_mib", "clients")),
        "cells": merged([run["cells"] for run in runs], ("server", "transport", "op", "size_mib", "clients")),
    }


def report(result: dict[str, Any], png: Path | None, markdown: bool) -> None:
    rows = result["cells"]
    if png:
        plot(rows, png, result.get("client_ceiling", []), result.get("store_ceiling", []))
    if markdown:
        print("\nTCP\n" + table(rows, "tcp", result.get("client_ceiling"), result.get("store_ceiling")))
        if any(r["transport"] == "unix" for r in rows):
            print("\nUnix socket\n" + table(rows, "unix"))
            print("\nUnix socket, Strata GET: bytes vs shared memory\n" + shared_table(rows, result["memcpy_gbps"]))


if __name__ == "__main__":
    main()
