"""Demo of the preloader path end to end, for `make demo`:

1. start a local S3-compatible server (moto, loopback) and upload a generated multi-GB model to it;
2. `strata-loader fetch s3://... DIR` with its progress bar (what a ModelCache preloader Job runs);
3. load the fetched files with the streamer and with plain `safetensors.torch.load_file`, round after round with
   the two sides alternating which goes first, warm (page cache full) and cold (emptied, where this user may), and
   print each side's median throughput with its range and the ratio: one unrepeated pair right after the builds
   told newcomers the opposite of what a quiet run shows.

    python bench/loader_demo.py [--size-gib 2] [--rounds 3] [--dir /tmp/strata-demo]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "testsupport"))
sys.path.insert(0, str(HERE))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/strata-demo"))
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()

    from loader_bench import make_model
    from strata_testsupport.s3 import running_s3_server

    src = make_model(args.dir / "generated", args.size_gib, 4)
    dest = args.dir / "fetched"
    with running_s3_server() as s3:
        bucket = s3.create_bucket("models")
        print(f"uploading {len(src)} files to {s3.endpoint_url}/{bucket}/demo-model ...", flush=True)
        client = s3.client()
        for p in src:
            client.upload_file(str(p), bucket, f"demo-model/{p.name}")
        cmd = [
            sys.executable,
            "-m",
            "strata_loader",
            "fetch",
            f"s3://{bucket}/demo-model",
            str(dest),
            "--verify",
            "sizes",
            "--progress",
            "bar" if sys.stderr.isatty() else "json",
        ]
        print("$ strata-loader " + " ".join(cmd[3:]), flush=True)
        subprocess.run(cmd, check=True, env={**os.environ, **s3.env()})

    files = sorted(str(p) for p in dest.glob("*.safetensors"))
    total = sum(os.path.getsize(f) for f in files)
    sides = {"strata_loader.load_files": _strata, "safetensors load_file+clone": _safetensors}
    states = ["warm", "cold"] if _can_drop_caches() else ["warm"]
    for state in states:
        rates: dict[str, list[float]] = {name: [] for name in sides}
        for round_no in range(args.rounds):
            order = list(sides) if round_no % 2 == 0 else list(reversed(sides))
            for name in order:
                _prepare(files, state)
                t0 = time.perf_counter()
                sides[name](files)
                rates[name].append(total / (time.perf_counter() - t0) / 1e9)
        print(f"{state} ({args.rounds} rounds, sides alternating, {total / 2**30:.2f} GiB): median GB/s (range)")
        for name, values in rates.items():
            print(f"  {name:30} {statistics.median(values):6.2f} ({min(values):.2f}-{max(values):.2f})", flush=True)
        ratios = [a / b for a, b in zip(*rates.values(), strict=True)]
        print(
            f"  strata / safetensors per round: median {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f}-{max(ratios):.2f})",
            flush=True,
        )


def _can_drop_caches() -> bool:
    return os.access("/proc/sys/vm/drop_caches", os.W_OK)


def _prepare(files: list[str], state: str) -> None:
    """Warm: every file in the page cache; cold: the page cache emptied (root only)."""
    if state == "warm":
        subprocess.run(["cat", *files], stdout=subprocess.DEVNULL, check=True)
    else:
        os.sync()
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _strata(files: list[str]) -> object:
    import strata_loader

    return strata_loader.load_files(files)


def _safetensors(files: list[str]) -> object:
    from safetensors.torch import load_file

    return {k: v.clone() for f in files for k, v in load_file(f).items()}


if __name__ == "__main__":
    main()
