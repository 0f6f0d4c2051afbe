"""The tensor API's subcommands: `shard` (pre-sharding for tensor-parallel ranks, no torch) and `bench` (the
streamer against safetensors, needs torch).

Registered in `strata_loader.cli.SUBCOMMANDS`. Both import their modules inside the handler, so listing the
commands never loads torch.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from strata_units import parse_bytes


def add_shard(sub: argparse._SubParsersAction) -> None:
    s = sub.add_parser("shard", help="pre-shard a model for tensor-parallel ranks")
    s.add_argument("src", help="directory with *.safetensors")
    s.add_argument("--tp", type=int, required=True, help="tensor-parallel size")
    s.add_argument("--out", default=None, help="output directory (default: SRC/sharded)")
    s.add_argument("--max-part-bytes", default="5Gi")
    s.set_defaults(handler=_shard)


def add_bench(sub: argparse._SubParsersAction) -> None:
    b = sub.add_parser(
        "bench", help="load files with the streamer and with safetensors; print throughput (needs torch)"
    )
    b.add_argument("paths", nargs="+")
    b.add_argument("--concurrency", type=int, default=None)
    b.set_defaults(handler=_bench)


def _shard(args: argparse.Namespace) -> int:
    from .shard import shard_directory

    src = Path(args.src)
    out = Path(args.out) if args.out else src / "sharded"
    files = shard_directory(src, out, args.tp, parse_bytes(args.max_part_bytes))
    print(json.dumps({"event": "sharded", "tp": args.tp, "files": [str(f) for f in files]}))
    return 0


def _bench(args: argparse.Namespace) -> int:
    import time

    try:
        import safetensors.torch

        from .api import load_files
    except ModuleNotFoundError as e:
        if e.name is None or e.name.partition(".")[0] not in {"torch", "safetensors"}:
            raise
        raise RuntimeError(
            f"needs torch and safetensors ({e.name} is not installed): pip install 'strata[tensor]'"
        ) from None
    from ..core.concurrency import concurrency_for

    total = sum(os.path.getsize(p) for p in args.paths)
    conc = concurrency_for(args.paths, args.concurrency)
    rows = []
    for name, fn in (
        ("strata_loader.load_files", lambda: load_files(args.paths, concurrency=conc)),
        (
            "safetensors load_file+clone",
            lambda: {k: v.clone() for p in args.paths for k, v in safetensors.torch.load_file(p).items()},
        ),
    ):
        t0 = time.perf_counter()
        out = fn()
        dt = time.perf_counter() - t0
        del out
        rows.append({"reader": name, "seconds": round(dt, 3), "GBps": round(total / dt / 1e9, 3)})
    for r in rows:
        print(json.dumps(r))
    return 0
