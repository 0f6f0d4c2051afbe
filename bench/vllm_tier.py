"""Strata's vLLM tier against vLLM's own `fs` tier: store and load throughput between the CPU primary tier's memory
and the tier, at the chunk sizes vLLM produces for 1.5B, 8B and 70B models, side by side in one run.

vLLM 0.33 runs in its own venv (hack/build-vllm-venv.sh) and builds every setup from `--kv-transfer-config`
JSON: the one the operator renders for a KVCacheTier (OffloadingConnector + TieringOffloadingSpec + StrataTier,
pointed at a local `strata-kv` with an L1 big enough for the run) over TCP, the same rendered with `nodeSocket`
(shared memory) and given the server's Unix socket, and the same with vLLM's `fs` tier on the same disk instead.
A chunk is 256 tokens (`block_size` 256) of the model's KV: 28 KiB per token for Qwen2.5-1.5B
(28 layers x 2 KV heads x 128 x fp16 x K,V) = 7 MiB, 128 KiB for Llama-3-8B = 32 MiB, 320 KiB for Llama-3-70B
= 80 MiB. Store: from `complete_store` (the cascade starts) until the tier has finished every job. Load: a second
engine's first lookup until vLLM reports every chunk HIT in its CPU tier (lookup + promotion). Every loaded chunk
is compared with what was stored. vLLM's fs tier uses O_DIRECT where the filesystem allows it (it probes), so its
reads come from the device; `--drop-caches` (root) also empties the page cache before each load. The server's
L1 is 1 GiB (a fresh server per run), no L2: the comparison is DRAM on the node vs the node's disk. Best of
`--repeat` alternating runs; read the ratios, not the absolutes.

    .venv/bin/python bench/vllm_tier.py [--repeat 3] [--drop-caches] [--output bench/results/vllm_tier.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testsupport"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "operator"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kvserver"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "units"))

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.connection import build_connection_config_map
from strata_operator.resources.kvcachetier.names import TierRef
from strata_testsupport.kvserver import running_kv_server
from strata_testsupport.vllm import VllmScript

ROOT = Path(__file__).resolve().parents[1]
ENGINE = ROOT / "kvserver" / "tests" / "vllm" / "engine.py"
CHUNK_TOKENS = 256
SERVER_CONFIG = {"l1": {"size": "1GiB"}, "metrics": {"port": -1}}
"""The server's DRAM holds a whole run (at most 640 MiB of chunks), with no L2."""
SOCKET_SERVER_CONFIG = {**SERVER_CONFIG, "listen": {"shared_memory": True}}
"""The same server, also handing values over its Unix socket as memory (`nodeSocket.sharedMemory`)."""


def model(layers: int, kv_heads: int) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 2048,
        "num_attention_heads": 8 * kv_heads,
        "num_key_value_heads": kv_heads,
        "head_dim": 128,
        "num_hidden_layers": layers,
        "vocab_size": 1024,
        "max_position_embeddings": 8192,
        "torch_dtype": "float16",
        "rms_norm_eps": 1e-5,
    }


# name -> (model config, chunks per run): about 0.5 GiB per run, so the CPU tiers and the server's L1 fit.
MODELS = {
    "1.5B (28 KiB/token)": (model(28, 2), 64),
    "8B (128 KiB/token)": (model(32, 8), 16),
    "70B (320 KiB/token)": (model(80, 8), 8),
}


TIERS = ("strata", "strata-socket", "vllm-fs")
"""Strata's tier through the node-local Service (TCP), through the node socket with shared memory
(`nodeSocket: {enabled, sharedMemory}`: loads copy once out of the server's memory), and vLLM's own fs tier."""


def transfer_config(port: int, cpu_bytes: int, fs_root: Path | None, unix_socket: str | None = None) -> str:
    """The operator's rendering for a tier on this port (or its node socket); with `fs_root`, vLLM's fs tier in
    place of Strata's."""
    spec: dict[str, Any] = {
        "chunkTokens": CHUNK_TOKENS,
        "connector": {"cpuBytes": str(cpu_bytes)},
        "auth": {"disabled": True},
    }
    if unix_socket is not None:
        spec["nodeSocket"] = {"enabled": True, "sharedMemory": True}
    data = build_connection_config_map(KVCacheTierSpec.model_validate(spec), TierRef("kv", "bench", "uid"))["data"]
    transfer = json.loads(data["KV_TRANSFER_CONFIG"])
    extra = transfer["kv_connector_extra_config"]
    if fs_root is None:
        extra["secondary_tiers"][0]["url"] = f"redis://127.0.0.1:{port}"
        if unix_socket is not None:
            extra["secondary_tiers"][0]["unix_socket"] = unix_socket  # where the CSI volume would mount it
    else:
        extra["secondary_tiers"] = [{"type": "fs", "root_dir": str(fs_root)}]
    return json.dumps(transfer)


def run_one(
    vllm: VllmScript,
    tier: str,
    name: str,
    cfg: dict[str, Any],
    chunks: int,
    port: int,
    work: Path,
    run: int,
    cold: bool,
    unix_socket: str | None = None,
) -> dict[str, Any]:
    chunk_bytes = CHUNK_TOKENS * 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * cfg["head_dim"] * 2
    fs_root = work / f"fs-{run}" if tier == "vllm-fs" else None
    request = {
        "mode": "bench",
        "workdir": str(work / "models" / name.split()[0]),
        "model": cfg,
        "kv_transfer_config": transfer_config(
            port, chunk_bytes * (chunks + 2), fs_root, unix_socket if tier == "strata-socket" else None
        ),
        "prefix_caching_hash_algo": "sha256_cbor",
        "chunks": chunks,
        "salt": f"{tier}-{name}-{run}",
    }
    if cold and fs_root is not None:
        request["drop_caches_before_load"] = True
    result = vllm.call(request, timeout=1800)
    if fs_root is not None:
        shutil.rmtree(fs_root, ignore_errors=True)
    assert result["chunk_bytes"] == chunk_bytes, (result["chunk_bytes"], chunk_bytes)
    assert result["equal"] == result["hits"], f"{tier} {name}: {result['hits'] - result['equal']} chunks corrupted"
    assert result["hits"] == chunks, f"{tier} {name}: only {result['hits']} of {chunks} chunks were found"
    total = chunk_bytes * chunks
    return {
        "tier": tier,
        "model": name,
        "chunk_bytes": chunk_bytes,
        "chunks": chunks,
        "store_gbps": total / result["store_seconds"] / 1e9,
        "load_gbps": total / result["load_seconds"] / 1e9,
        "store_chunks_per_s": chunks / result["store_seconds"],
        "load_chunks_per_s": chunks / result["load_seconds"],
    }


def best(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out = dict(rows[0])
    for key in ("store_gbps", "load_gbps", "store_chunks_per_s", "load_chunks_per_s"):
        out[key] = max(r[key] for r in rows)
    out["runs"] = len(rows)
    return out


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| model (chunk) | tier | store GB/s | store chunks/s | load GB/s | load chunks/s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['model']} ({r['chunk_bytes'] // 1024**2} MiB) | {r['tier']} | {r['store_gbps']:.2f} | "
            f"{r['store_chunks_per_s']:.0f} | {r['load_gbps']:.2f} | {r['load_chunks_per_s']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3, help="best of N alternating runs")
    ap.add_argument("--drop-caches", action="store_true", help="empty the page cache before each fs load (root)")
    ap.add_argument("--work-dir", default=None, help="where the fs tier writes (default: a temp dir on /tmp's disk)")
    ap.add_argument("--output", default=str(ROOT / "bench" / "results" / "vllm_tier.json"))
    args = ap.parse_args()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="strata-vllm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    vllm = VllmScript(ENGINE, work)
    try:
        for run in range(args.repeat):
            for name, (cfg, chunks) in MODELS.items():
                for tier in TIERS if run % 2 == 0 else TIERS[::-1]:
                    # A fresh server per run: what earlier runs stored would fill its L1 and evict this run's chunks.
                    config = SOCKET_SERVER_CONFIG if tier == "strata-socket" else SERVER_CONFIG
                    with running_kv_server(work / f"kv-{run}-{tier}", config, l2_fs=False) as server:
                        row = run_one(
                            vllm, tier, name, cfg, chunks, server.port, work, run, args.drop_caches, server.unix_socket
                        )
                    results.setdefault((name, tier), []).append(row)
                    print(json.dumps(row), flush=True)
    finally:
        vllm.close()
    rows = [best(v) for v in results.values()]
    report = {
        "benchmark": "vllm_tier",
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
        "settings": {
            "chunk_tokens": CHUNK_TOKENS,
            "repeat": args.repeat,
            "fs_page_cache": "cold" if args.drop_caches else "warm",
        },
        "results": rows,
    }
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(report, indent=2) + "\n")
    print(markdown(rows))


if __name__ == "__main__":
    main()
