"""Model-loading benchmark: Strata's loader against its peers on the same files, in one run.

    python bench/loader_bench.py [--size-gib 2] [--files 4] [--s3] [--repeat 2]

Peers: `safetensors.torch.load_file` (+ clone: it returns lazy mmap views), `safe_open(backend="pread")`,
runai-model-streamer with its default (O_DIRECT) and `sync_buffered` strategies. Limits: `dd bs=16M` (cold) and a
memcpy between touched buffers (warm). Cold means the page cache is dropped before the run (root only).
Every measurement runs in its own process so one reader's heap or cache state does not help the next.
Prints a Markdown table with throughput and ratios; timing claims live here, never in tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "strata" / "bench-model"


def make_model(root: Path, size_gib: float, files: int) -> list[Path]:
    """A Llama-shaped model: 32 MiB bf16 matrices with small norms between them, split into `files` shards."""
    import torch
    from safetensors.torch import save_file

    paths = [root / f"model-{i + 1:05d}-of-{files:05d}.safetensors" for i in range(files)]
    if all(p.exists() for p in paths):
        return paths
    root.mkdir(parents=True, exist_ok=True)
    per_file = int(size_gib * 2**30 / files)
    gen = torch.Generator().manual_seed(0)
    layer = 0
    for p in paths:
        tensors, size = {}, 0
        while size + 32 * 2**20 <= per_file:
            bits = torch.randint(-(2**15), 2**15, (4096 * 4096,), dtype=torch.int16, generator=gen)
            tensors[f"model.layers.{layer}.mlp.up_proj.weight"] = bits.view(torch.bfloat16).reshape(4096, 4096)
            tensors[f"model.layers.{layer}.post_attention_layernorm.weight"] = torch.ones(4096, dtype=torch.bfloat16)
            size += 32 * 2**20 + 8192
            layer += 1
        save_file(tensors, str(p) + ".tmp", metadata={"format": "pt"})
        os.replace(str(p) + ".tmp", p)
    return paths


# ---- one measurement, run in a child process -------------------------------------------------------------


def run_one(reader: str, paths: list[str]) -> dict[str, float]:
    from strata_loader.core.sources import open_reader

    nbytes = sum(open_reader(p).size for p in paths)  # local files or s3:// objects
    t0 = time.perf_counter()
    if reader == "strata":
        import strata_loader

        out = strata_loader.load_files(paths)
    elif reader == "strata-stream":
        import strata_loader

        for _name, _t in strata_loader.iter_tensors(paths, copy=False):
            pass
    elif reader == "safetensors":
        from safetensors.torch import load_file

        out = {k: v.clone() for p in paths for k, v in load_file(p).items()}
    elif reader == "safetensors-pread":
        from safetensors import safe_open

        out = {}
        for p in paths:
            with safe_open(p, "pt", backend="pread") as f:
                out.update({k: f.get_tensor(k) for k in f.keys()})  # noqa: SIM118 -- not a dict
    elif reader.startswith("runai"):
        from runai_model_streamer import SafetensorsStreamer

        owned = reader != "runai-sync-stream"
        out = {}
        with SafetensorsStreamer() as s:
            s.stream_files(paths, owned=owned)
            for name, t in s.get_tensors():
                if owned:
                    out[name] = t
    elif reader == "dd":
        for p in paths:
            subprocess.run(["dd", f"if={p}", "of=/dev/null", "bs=16M"], check=True, capture_output=True)
    elif reader == "memcpy":
        import numpy as np

        src = np.ones(nbytes, dtype=np.uint8)
        dst = np.ones(nbytes, dtype=np.uint8)  # both touched: the copy measures memory bandwidth only
        t0 = time.perf_counter()
        np.copyto(dst, src)
    elif reader.startswith("s3-strata"):
        import strata_loader

        out = strata_loader.load_files(paths, concurrency=16)
    elif reader == "s3-boto3-download+safetensors":
        import boto3
        from safetensors.torch import load_file

        c = boto3.client("s3")
        out = {}
        with tempfile.TemporaryDirectory() as d:
            for uri in paths:
                bucket, key = uri[5:].split("/", 1)
                local = os.path.join(d, os.path.basename(key))
                c.download_file(bucket, key, local)
                out.update({k: v.clone() for k, v in load_file(local).items()})
    else:
        raise SystemExit(f"unknown reader {reader}")
    seconds = time.perf_counter() - t0
    return {"seconds": seconds, "bytes": nbytes}


# ---- orchestration -----------------------------------------------------------------------------------------

LOCAL_READERS = [
    "strata",
    "strata-stream",
    "safetensors",
    "safetensors-pread",
    "runai",
    "runai-sync",
    "runai-sync-stream",
]


def drop_caches() -> bool:
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return True
    except OSError:
        return False


def warm(paths: list[Path]) -> None:
    for p in paths:
        subprocess.run(["cat", str(p)], stdout=subprocess.DEVNULL, check=True)


def measure(reader: str, paths: list[str], env: dict[str, str] | None = None) -> float:
    cmd = [sys.executable, __file__, "--one", reader, *paths]
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=1800)
    if r.returncode != 0:
        raise RuntimeError(f"{reader} failed: {r.stderr.strip()[-800:]}")
    res = json.loads(r.stdout.strip().splitlines()[-1])
    return res["bytes"] / res["seconds"] / 1e9


def reader_env(reader: str) -> dict[str, str]:
    return {"RUNAI_STREAMER_FS_STRATEGY": "sync_buffered"} if reader.startswith("runai-sync") else {}


def bench_local(paths: list[Path], repeat: int) -> dict[str, dict[str, float]]:
    files = [str(p) for p in paths]
    results: dict[str, dict[str, float]] = {}
    can_cold = drop_caches()
    runs: dict[tuple[str, str], list[float]] = {}
    for mode in ("warm", "cold") if can_cold else ("warm",):
        for _ in range(repeat):  # rounds interleave the readers, so load from elsewhere hits all alike
            for reader in [*LOCAL_READERS, "dd", "memcpy"]:
                if reader == "memcpy" and mode == "cold":
                    continue
                if mode == "cold":
                    drop_caches()
                else:
                    warm(paths)
                gbps = measure(reader, files, reader_env(reader))
                runs.setdefault((reader, mode), []).append(gbps)
                print(f"  {mode:4} {reader:22} {gbps:6.2f} GB/s", file=sys.stderr, flush=True)
    for (reader, mode), r in runs.items():
        results.setdefault(reader, {})[mode] = statistics.median(r)
    return results


WEED = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "strata" / "bin" / "seaweedfs" / "weed"


@contextlib.contextmanager
def running_weed_server() -> Iterator[Any]:
    """SeaweedFS (`weed server -s3`, built from its Go module into the cache) on loopback, auth off."""
    import socket
    import urllib.request

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testsupport"))
    from strata_testsupport.s3 import S3Server

    def free_port() -> int:
        while True:  # weed also listens on port + 10000 for gRPC
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = int(s.getsockname()[1])
            if port < 55000:
                return port

    ports = [free_port() for _ in range(4)]
    with tempfile.TemporaryDirectory() as data:
        proc = subprocess.Popen(
            [
                str(WEED),
                "server",
                f"-dir={data}",
                "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1",
                "-s3",
                f"-master.port={ports[0]}",
                f"-volume.port={ports[1]}",
                f"-filer.port={ports[2]}",
                f"-s3.port={ports[3]}",
                "-master.volumeSizeLimitMB=1024",
                "-volume.max=0",
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(data, "weed.log"), "wb"),  # noqa: SIM115
        )
        url = f"http://127.0.0.1:{ports[3]}"
        try:
            deadline = time.monotonic() + 90
            while True:
                try:
                    urllib.request.urlopen(url, timeout=2)
                    break
                except urllib.error.HTTPError:
                    break  # an S3 error reply: the gateway is up
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError("seaweedfs did not start; see its log") from None
                    time.sleep(0.5)
            yield S3Server(endpoint_url=url, process=proc)
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def bench_s3(paths: list[Path], repeat: int, server_kind: str = "moto") -> dict[str, dict[str, float]]:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testsupport"))
    from strata_testsupport.s3 import running_s3_server

    results: dict[str, dict[str, float]] = {}
    with running_weed_server() if server_kind == "seaweedfs" else running_s3_server() as server:
        bucket = server.create_bucket("bench")
        c = server.client()
        for p in paths:
            c.upload_file(str(p), bucket, f"model/{p.name}")
        uris = [f"s3://{bucket}/model/{p.name}" for p in paths]
        for reader in ("s3-strata", "s3-boto3-download+safetensors"):
            runs = [measure(reader, uris, server.env()) for _ in range(repeat)]
            results[reader] = {"warm": statistics.median(runs)}
            print(f"  s3   {reader:30} {results[reader]['warm']:6.2f} GB/s", file=sys.stderr, flush=True)
    return results


def _ratio(x: float | None, y: float | None) -> str:
    return f"{x / y:.2f}x" if x and y else "-"


def _gbps(x: float | None) -> str:
    return f"{x:.2f}" if x else "-"


def table(local: dict[str, dict[str, float]], s3: dict[str, dict[str, float]], total_gib: float) -> str:
    peers = ["safetensors", "safetensors-pread", "runai", "runai-sync", "runai-sync-stream"]
    best = {m: max((local[p].get(m, 0) for p in peers if p in local), default=0) for m in ("warm", "cold")}
    memcpy, dd = local.get("memcpy", {}).get("warm"), local.get("dd", {}).get("cold")
    lines = [
        f"Model: {total_gib:.2f} GiB of bf16 safetensors in 4 files. GB/s = 10^9 bytes/s, median of the runs.",
        "",
        "| reader | warm GB/s | cold GB/s | warm / best peer | cold / best peer | warm / memcpy | cold / dd 16M |",
        "|---|---|---|---|---|---|---|",
    ]
    for reader, r in local.items():
        w, c = r.get("warm"), r.get("cold")
        lines.append(
            f"| {reader} | {_gbps(w)} | {_gbps(c)} | {_ratio(w, best['warm'])} | {_ratio(c, best['cold'])} "
            f"| {_ratio(w, memcpy)} | {_ratio(c, dd)} |"
        )
    if s3:
        lines += ["", "| S3 reader (S3 server on loopback) | GB/s |", "|---|---|"]
        lines += [f"| {k} | {v['warm']:.3f} |" for k, v in s3.items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)
    ap.add_argument("paths", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--dir", type=Path, default=CACHE)
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--files", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--s3", action="store_true", help="also read from a local S3 server (moto: slow)")
    ap.add_argument("--s3-files", type=int, default=1, help="how many of the files go through S3")
    ap.add_argument(
        "--s3-server",
        choices=["moto", "seaweedfs"],
        default="moto",
        help=f"seaweedfs needs {WEED} (built from its Go module)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write raw results here")
    ap.add_argument("--table-from", type=Path, default=None, help="print the table of an earlier --json")
    args = ap.parse_args()
    if args.table_from:
        saved = json.loads(args.table_from.read_text())
        print(table(saved["local"], saved["s3"], args.size_gib))
        return
    if args.one:
        print(json.dumps(run_one(args.one, args.paths)))
        return
    paths = make_model(args.dir, args.size_gib, args.files)
    total = sum(p.stat().st_size for p in paths) / 2**30
    print(f"model: {len(paths)} files, {total:.2f} GiB in {args.dir}", file=sys.stderr)
    local = bench_local(paths, args.repeat)
    if args.json:
        args.json.write_text(json.dumps({"local": local, "s3": {}}, indent=1))
    s3 = bench_s3(paths[: args.s3_files], args.repeat, args.s3_server) if args.s3 else {}
    if args.json:
        args.json.write_text(json.dumps({"local": local, "s3": s3}, indent=1))
    print(table(local, s3, total))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
