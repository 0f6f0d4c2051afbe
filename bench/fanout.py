"""Download once, fan out: origin bytes and wall time until all N nodes hold a verified copy, fan-out beside
every node reading the origin, in one run.

    python bench/fanout.py [--size-gib 2] [--nodes 1,4,8] [--json bench/results/fanout.json] \
        [--png bench/results/fanout.png]

Each node is a real `strata-loader fetch` process with its own directory; the origin is the real S3 server
(moto's server mode, the test fixture's) behind a loopback proxy that counts what it serves. Two ways per N:
- origin: all N fetches start at once, each reading the whole model from the origin;
- fanout: what the operator does: the first node reads the origin; once its copy is verified, `serve-peer`
  serves it and the other N-1 fetch at once from that peer (`--peer`, token file), hashing every file.
Both use `--verify checksums`, the same block size, concurrency and memory limit. The model is random bytes in
4 files (fetch copies bytes; their format does not matter). Node directories are removed after each run.
Timing claims live here, never in tests; on these shared 2-core machines compare the ratios, not the seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for sub in ("loader", "testsupport", "units"):
    sys.path.insert(0, str(ROOT / sub))

from strata_loader.contract import FetchRequest, VerifyMode  # noqa: E402
from strata_testsupport.counting_proxy import CountingProxy  # noqa: E402
from strata_testsupport.peers import fetch_process, finish_fetch, running_peer, write_token  # noqa: E402
from strata_testsupport.s3 import running_s3_server  # noqa: E402

MiB = 2**20
FILES = 4


def make_origin(server: Any, workdir: Path, size: int) -> tuple[str, int]:
    """Upload `size` random bytes as FILES objects; the model's URI and its exact size."""
    bucket = server.create_bucket("fanout-bench")
    client = server.client()
    per = size // FILES
    for i in range(FILES):
        path = workdir / "part.bin"
        with open(path, "wb") as f:
            left = per
            while left:
                n = min(left, 64 * MiB)
                f.write(os.urandom(n))
                left -= n
        client.upload_file(str(path), bucket, f"model/model-{i + 1:05d}-of-{FILES:05d}.bin")
        path.unlink()
    return f"s3://{bucket}/model", per * FILES


def args_for(uri: str, dest: Path, opts: argparse.Namespace, peers: list[str], token: Path | None) -> list[str]:
    return FetchRequest(
        source=uri,
        dest=str(dest),
        verify=VerifyMode.CHECKSUMS,
        concurrency=opts.concurrency,
        block_size=opts.block_size,
        memory_limit=opts.memory_limit,
        peers=peers,
        peer_token_file=str(token) if peers else None,
    ).to_args()


def run_nodes(
    uri: str, env: dict[str, str], dests: list[Path], opts: argparse.Namespace, peers: list[str], token: Path | None
) -> list[dict[str, Any]]:
    logs = [d.parent / f"{d.name}.termination" for d in dests]
    procs = [fetch_process(args_for(uri, d, opts, peers, token), env, log) for d, log in zip(dests, logs, strict=True)]
    return [finish_fetch(p, log, timeout=3600) for p, log in zip(procs, logs, strict=True)]


def one_run(mode: str, n: int, uri: str, size: int, env: dict[str, str], proxy: CountingProxy,
            work: Path, token: Path, opts: argparse.Namespace) -> dict[str, Any]:  # fmt: skip
    dests = [work / f"{mode}-{n}-node-{i + 1}" for i in range(n)]
    proxy.reset()
    t0 = time.perf_counter()
    first_done = None
    try:
        if mode == "origin":
            results = run_nodes(uri, env, dests, opts, [], None)
        else:
            results = run_nodes(uri, env, dests[:1], opts, [], None)
            first_done = time.perf_counter() - t0
            if n > 1:
                with running_peer(dests[0], token) as peer:
                    results += run_nodes(uri, env, dests[1:], opts, [peer.url], token)
        seconds = time.perf_counter() - t0
        sums = {json.dumps(r["checksums"], sort_keys=True) for r in results}
        if len(sums) != 1:
            raise RuntimeError(f"{mode} N={n}: the nodes' copies differ: {sums}")
    finally:
        for d in dests:
            shutil.rmtree(d, ignore_errors=True)
    row = {
        "mode": mode,
        "nodes": n,
        "seconds": round(seconds, 2),
        "first_node_seconds": round(first_done, 2) if first_done is not None else None,
        "origin_range_bytes": proxy.range_bytes,
        "origin_response_bytes": proxy.response_bytes,
        "origin_copies": round(proxy.range_bytes / size, 3),
        "bytes_from_peers": sum(int(r["bytes_from_peers"]) for r in results),
        "model_bytes": size,
    }
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


def markdown(rows: list[dict[str, Any]]) -> str:
    """Served: bytes the origin sent (responses, headers included); requested: the ranges asked for, retries of
    ranges that timed out included."""
    out = [
        "| nodes | every node from the origin: GiB served (requested) | fan-out: GiB served (requested) |"
        " served ratio | origin: s to all done | fan-out: s to all done (first node) | time ratio fan-out/origin |",
        "|---|---|---|---|---|---|---|",
    ]
    by = {(r["mode"], r["nodes"]): r for r in rows}
    for n in sorted({r["nodes"] for r in rows}):
        o, f = by.get(("origin", n)), by.get(("fanout", n))
        if not (o and f):
            continue
        gib = 2**30
        out.append(
            f"| {n} | {o['origin_response_bytes'] / gib:.2f} ({o['origin_range_bytes'] / gib:.2f}) |"
            f" {f['origin_response_bytes'] / gib:.2f} ({f['origin_range_bytes'] / gib:.2f}) |"
            f" {f['origin_response_bytes'] / o['origin_response_bytes']:.3f} | {o['seconds']:.1f} |"
            f" {f['seconds']:.1f} ({f['first_node_seconds']:.1f}) | {f['seconds'] / o['seconds']:.2f} |"
        )
    return "\n".join(out)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for mode, style, label in (("origin", "s--", "every node from the origin"), ("fanout", "o-", "fan-out")):
        pts = sorted((r["nodes"], r) for r in rows if r["mode"] == mode)
        xs = [p[0] for p in pts]
        axes[0].plot(xs, [p[1]["origin_response_bytes"] / 2**30 for p in pts], style, label=label)
        axes[1].plot(xs, [p[1]["seconds"] for p in pts], style, label=label)
    axes[0].set_ylabel("GiB served by the origin")
    axes[1].set_ylabel("seconds until all nodes are done")
    for ax in axes:
        ax.set_xlabel("nodes")
        ax.grid(True, alpha=0.3)
        ax.legend()
    size = rows[0]["model_bytes"] / 2**30
    fig.suptitle(f"{size:.1f} GiB model, real fetch processes on loopback, moto S3 as the origin")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--nodes", default="1,4,8")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--block-size", default="16Mi")
    ap.add_argument("--memory-limit", default="256Mi", help="per fetch process")
    ap.add_argument("--workdir", type=Path, default=None, help="where node directories go (default: a temp dir)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--png", type=Path)
    ap.add_argument(
        "--table", type=Path, metavar="JSON", help="print the table (and --png) of a saved run; run nothing"
    )
    opts = ap.parse_args()
    if opts.table:
        saved = json.loads(opts.table.read_text())["rows"]
        if opts.png:
            plot(saved, opts.png)
        print(markdown(saved))
        return
    nodes = [int(x) for x in opts.nodes.split(",")]
    rows: list[dict[str, Any]] = []
    with ExitStack() as stack:
        work = Path(stack.enter_context(tempfile.TemporaryDirectory(dir=opts.workdir, prefix="strata-fanout-")))
        server = stack.enter_context(running_s3_server())
        uri, size = make_origin(server, work, int(opts.size_gib * 2**30))
        proxy = stack.enter_context(CountingProxy(int(server.endpoint_url.rsplit(":", 1)[1])))
        env = {**server.env(), "AWS_ENDPOINT_URL": proxy.endpoint_url}
        token = write_token(work / "token")
        for i, n in enumerate(nodes):
            modes = ("origin", "fanout") if i % 2 == 0 else ("fanout", "origin")  # alternate who runs first
            for mode in modes:
                rows.append(one_run(mode, n, uri, size, env, proxy, work, token, opts))
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "load": os.getloadavg(), "rows": rows}
    result["options"] = {k: str(v) for k, v in vars(opts).items()}
    if opts.json:
        opts.json.write_text(json.dumps(result, indent=1) + "\n")
    if opts.png:
        plot(rows, opts.png)
    print(markdown(rows))


if __name__ == "__main__":
    main()
