"""The offload verdict over a real run: traffic that pays, then traffic that does not.

A real `strata-kv serve` takes requests the way an engine sends them (a document is a chain of chunks: GET each
until the first miss, then SET the rest). Phase 1 reuses a few popular documents (Zipf over `--docs`), phase 2
sends a new document every request. Every `--scrape-seconds` the operator's own code reads the server's /metrics
(`handlers/kvcachetier/io.scrape`) and judges it (`resources/kvcachetier/offload.offload_status`, the function
status.offload comes from), exactly as the controller does with its window; the verdicts are written to JSON and
drawn as a PNG.

    .venv/bin/python bench/offload_verdict.py [--phase-seconds 60] [--output bench/results/offload_verdict.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testsupport"))

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.handlers.kvcachetier.io import scrape
from strata_operator.resources.kvcachetier.offload import offload_status, sample
from strata_testsupport.kvserver import running_kv_server

VALUE_BYTES = 64 * 1024


def rfc3339(moment: float) -> str:
    return datetime.datetime.fromtimestamp(moment, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def request(client: Any, doc: str, chunks: int, value: bytes) -> None:
    """One engine request: the leading chunks the server holds are loaded, the rest computed and stored."""
    position = 0
    while position < chunks and client.get(f"{doc}@{position}") is not None:
        position += 1
    for missing in range(position, chunks):
        client.set(f"{doc}@{missing}", value)


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    spec = KVCacheTierSpec.model_validate(
        {
            "l1": {"size": args.l1},
            "chunkTokens": args.chunk_tokens,
            "offloadVerdict": {
                "windowSeconds": args.window_seconds,
                "minLookups": args.min_lookups,
                "engineOverheadMicrosecondsPerLookup": args.engine_overhead_us,
            },
        }
    )
    rng = random.Random(7)
    weights = [1.0 / rank for rank in range(1, args.docs + 1)]
    value = bytes(VALUE_BYTES)
    points: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        running_kv_server(Path(tmp), {"l1": {"size": args.l1.replace("i", "iB")}}, l2_fs=False) as server,
    ):
        client = server.redis()
        status: dict[str, Any] | None = None
        started = time.time()
        unique = 0
        for phase in ("reused", "unique"):
            phase_end = time.time() + args.phase_seconds
            while time.time() < phase_end:
                scrape_at = min(time.time() + args.scrape_seconds, phase_end)
                while time.time() < scrape_at:
                    if phase == "reused":
                        doc = f"doc{rng.choices(range(args.docs), weights=weights)[0]}"
                    else:
                        unique += 1
                        doc = f"new{unique}"
                    request(client, doc, args.chunks_per_doc, value)
                usage = scrape("127.0.0.1", server.metrics_port)
                assert usage is not None, "the server's /metrics did not answer"
                now = time.time()
                status, message = offload_status(spec, status, sample([("bench/0", usage)], rfc3339(now)))
                point = {k: v for k, v in status.items() if k != "window"}
                point.update(t=round(now - started, 1), phase=phase, message=message)
                points.append(point)
                print(
                    f"{point['t']:6.1f}s {phase:7} {status['verdict']:16} hit {status['hitRatio']} "
                    f"break-even {status.get('breakEvenHitRatio', '-')} unread {status['unreadShare']} "
                    f"saved {status['recomputeSavedSeconds']} s load {status['loadSeconds']} s "
                    f"overhead {status['missOverheadSeconds']} s L1 {status.get('suggestedL1Size', '-')}",
                    flush=True,
                )
    return points


def plot(points: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t = [p["t"] for p in points]
    fig, (ratios, seconds) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True)
    ratios.plot(t, [float(p["hitRatio"]) for p in points], label="hit ratio", color="tab:blue")
    ratios.plot(t, [float(p.get("breakEvenHitRatio") or "nan") for p in points], label="break-even hit ratio",
                color="tab:red", linestyle="--")  # fmt: skip
    ratios.plot(t, [float(p["unreadShare"]) for p in points], label="stored, never read", color="tab:gray")
    ratios.set_ylabel("share")
    ratios.set_ylim(-0.02, 1.02)
    colors = {"Pays": "tab:green", "DoesNotPay": "tab:red", "InsufficientData": "tab:gray"}
    for start, end, point in zip([0.0, *t[:-1]], t, points, strict=True):  # a verdict is about the time before it
        ratios.axvspan(start, end, color=colors[point["verdict"]], alpha=0.12, linewidth=0)
    switch = next((p["t"] for p in points if p["phase"] == "unique"), None)
    for axis in (ratios, seconds):
        if switch is not None:
            axis.axvline(switch, color="black", linewidth=0.8)
    ratios.legend(loc="center left", fontsize=8)
    ratios.set_title("OffloadEffective over a real strata-kv run: reused prefixes, then unique ones\n"
                     "(background: green Pays, red DoesNotPay, gray InsufficientData)", fontsize=10)  # fmt: skip
    seconds.plot(t, [float(p["recomputeSavedSeconds"]) for p in points], label="recompute saved", color="tab:green")
    seconds.plot(t, [float(p["loadSeconds"]) + float(p["missOverheadSeconds"]) for p in points],
                 label="load + miss overhead", color="tab:red")  # fmt: skip
    seconds.set_yscale("symlog", linthresh=0.01)
    seconds.set_ylabel("seconds in the window")
    seconds.set_xlabel("seconds since start")
    seconds.legend(loc="center left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--phase-seconds", type=float, default=90.0, help="at least twice the window")
    parser.add_argument("--scrape-seconds", type=float, default=5.0)
    parser.add_argument("--window-seconds", type=int, default=30)
    parser.add_argument("--min-lookups", type=int, default=200)
    parser.add_argument("--docs", type=int, default=40, help="documents the first phase picks from (Zipf s=1)")
    parser.add_argument("--chunks-per-doc", type=int, default=8)
    parser.add_argument("--chunk-tokens", type=int, default=256)
    parser.add_argument(
        "--engine-overhead-us",
        type=int,
        default=1000,
        help="engineOverheadMicrosecondsPerLookup: 1 ms puts the break-even near the seed's 4%% "
        "(256-token chunks at 115 us per token)",
    )
    parser.add_argument("--l1", default="16Mi", help="L1 size: below the first phase's 20 MiB working set")
    parser.add_argument("--output", type=Path, default=Path("bench/results/offload_verdict.json"))
    args = parser.parse_args()
    points = run(args)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "points": points}, indent=1))
    plot(points, args.output.with_suffix(".png"))
    print(f"wrote {args.output} and {args.output.with_suffix('.png')}")


if __name__ == "__main__":
    main()
