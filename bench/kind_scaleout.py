"""Scale-out across kind's workers (issue 40 item 4): a vLLM Deployment (CPU) scales 1 -> 2 -> 4 replicas over the
two workers; per new replica, the seconds from the scale command to its first token, and per step the bytes the
model's origin (the S3 server) sent, counted by the kernel. Two sides, alternated per round:
- `strata`: a NodeLocal ModelCache (the model put on both workers once: one origin read, the second copy from the
  first worker's peer) and a KVCacheTier with an S3 L2, wired by labels;
- `s3-pull`: each pod's init container downloads the model from the origin into its emptyDir (boto3, as
  `aws s3 cp --recursive`), then vLLM loads it; no tier.
Every replica's first request is the same 1024-token prompt (a shared system prompt).

The measurement is e2e/bench_scaleout.py, run on the kind suite's cluster (built here with no pull, or the stock
node image: e2e/README.md) with its fixtures; this script runs it, then prints the medians with their range, the
ratios, and plots them. Needs root (kind's node image, the iptables byte counter), Docker, ~16 GB of disk for the
stock vLLM image in both workers and ~12 GB of memory for four engines.

    sudo .venv/bin/python bench/kind_scaleout.py [--rounds 3] [--shape 1g|test] [--output DIR]
    .venv/bin/python bench/kind_scaleout.py --report [--output DIR]      # print and plot a result again
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SIDES = ("strata", "s3-pull")
STEPS = (1, 2, 4)
COLORS = {"strata": "#2e7d32", "s3-pull": "#999"}


def measure(args: argparse.Namespace, result_file: Path) -> None:
    env = {
        **os.environ,
        "SCALEOUT_ROUNDS": str(args.rounds),
        "SCALEOUT_SHAPE": args.shape,
        "SCALEOUT_OUTPUT": str(result_file),
        "CI": "true",  # the suite's fixtures fail, rather than skip, on a missing prerequisite
    }
    command = [sys.executable, "-m", "pytest", str(REPO / "e2e" / "bench_scaleout.py"), "-s", "-p", "no:cacheprovider"]
    done = subprocess.run(command, cwd=REPO, env=env)
    if done.returncode:
        raise SystemExit(f"the measurement failed ({done.returncode}); what it measured is in {result_file}")


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """Per side and step: the new replicas' scale -> first token, the step's origin bytes, the tokens new replicas
    took from a cache; and s3-pull over strata per step."""
    rows: dict[str, dict[str, Any]] = {}
    for side in SIDES:
        for step in STEPS:
            replicas = [s for s in result["samples"] if (s["side"], s["step"], s["kind"]) == (side, step, "replica")]
            steps = [s for s in result["samples"] if (s["side"], s["step"], s["kind"]) == (side, step, "step")]
            if not replicas:
                continue
            rows[f"{side}/{step}"] = {
                "side": side,
                "step": step,
                "first_token_s": spread([r["scale_to_first_token_s"] for r in replicas]),
                "origin_mb": spread([s["origin_bytes"] / 1e6 for s in steps]),
                "cached_tokens": statistics.median(r["cached_tokens"] for r in replicas),
            }
    median = {key: row["first_token_s"]["median"] for key, row in rows.items()}
    ratios = {
        str(step): median[f"s3-pull/{step}"] / median[f"strata/{step}"]
        for step in STEPS
        if f"s3-pull/{step}" in rows and f"strata/{step}" in rows
    }
    return {"rows": rows, "s3_pull_over_strata": ratios}


def plot(result: dict[str, Any], report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (times, origin) = plt.subplots(1, 2, figsize=(11, 4.2))
    width = 0.38
    for i, side in enumerate(SIDES):
        rows = [report["rows"].get(f"{side}/{step}") for step in STEPS]
        xs = [j + (i - 0.5) * width for j, row in enumerate(rows) if row]
        got = [row for row in rows if row]
        medians = [r["first_token_s"]["median"] for r in got]
        low = [r["first_token_s"]["median"] - r["first_token_s"]["min"] for r in got]
        high = [r["first_token_s"]["max"] - r["first_token_s"]["median"] for r in got]
        times.bar(xs, medians, width, yerr=[low, high], capsize=3, color=COLORS[side], label=side)
        cumulative, total = [], 0.0
        for r in got:
            total += r["origin_mb"]["median"] / 1e3
            cumulative.append(total)
        origin.plot([STEPS[j] for j, row in enumerate(rows) if row], cumulative, "o-", color=COLORS[side], label=side)
    times.set_xticks(range(len(STEPS)), [f"-> {s}" for s in STEPS])
    times.set_xlabel("scale step (replicas)")
    times.set_ylabel("scale command -> new replica's first token (s)")
    times.set_title("Time to serve, median and range of new replicas")
    times.legend()
    origin.set_xticks(list(STEPS))
    origin.set_xlabel("replicas")
    origin.set_ylabel("GB sent by the origin (cumulative, median)")
    origin.set_title("Origin reads (the model cache's preload not included)")
    origin.legend()
    fig.suptitle(
        f"vLLM (CPU) scale-out on kind, 2 workers, {result['model_bytes'] / 1e9:.2f} GB model, "
        f"{result['rounds']} rounds"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shape", choices=("1g", "test"), default="1g")
    parser.add_argument("--output", type=Path, default=REPO / "bench" / "results" / "kind_scaleout")
    parser.add_argument("--report", action="store_true", help="only print and plot the result in --output")
    args = parser.parse_args()
    args.output.mkdir(parents=True, exist_ok=True)
    result_file = args.output / "result.json"
    if not args.report:
        measure(args, result_file)
    result = json.loads(result_file.read_text())
    report = summary(result)
    (args.output / "summary.json").write_text(json.dumps(report, indent=2))
    plot(result, report, args.output / "scaleout.png")
    print(f"{'side':<8} {'step':>4} {'scale -> first token (s)':>26} {'origin MB':>16} {'cached tokens':>14}")
    for row in report["rows"].values():
        t, o = row["first_token_s"], row["origin_mb"]
        print(
            f"{row['side']:<8} {row['step']:>4} {t['median']:>8.1f} ({t['min']:.1f}-{t['max']:.1f}, n={t['n']})"
            f" {o['median']:>9.0f} ({o['min']:.0f}-{o['max']:.0f}) {row['cached_tokens']:>8.0f}"
        )
    preload = result.get("preload") or {}
    if preload:
        print(
            f"strata's preload (once, both workers): {preload['seconds']:.1f}s, origin sent "
            f"{preload['origin_bytes'] / 1e6:.0f} MB for a {result['model_bytes'] / 1e6:.0f} MB model"
        )
    ratios = ", ".join(f"-> {step}: {ratio:.2f}x" for step, ratio in report["s3_pull_over_strata"].items())
    print(f"s3-pull / strata, median time to first token: {ratios}; written to {args.output}")


if __name__ == "__main__":
    main()
