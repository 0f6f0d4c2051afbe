"""`--load-format strata` against vLLM's default safetensors loader: the time of vLLM's `load_model` (model init,
weight loading, post-processing) for a small random-weight Llama on CPU, both in the same vLLM process and run.

vLLM 0.33 runs in its own venv (hack/build-vllm-venv.sh); the plugin is found through its entry point. Each round
loads the same files with both loaders, alternating which goes first (the first pays first-time costs and, with
`--drop-caches`, the disk reads), and checks that every parameter is bit-identical. The files were just written,
so without `--drop-caches` (root; empties the page cache before each round) both read from the page cache. CPU
tensors go to CPU parameters, so this measures read + copy paths, not host-to-GPU transfer. Best of `--repeat`;
read the ratio, not the absolutes.

    .venv/bin/python bench/vllm_loader.py [--layers 8] [--repeat 4] [--drop-caches] [--output FILE.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testsupport"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "loader"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "units"))

from strata_testsupport.vllm_loader import CONFIG, loader_script, write_model


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--repeat", type=int, default=4)
    p.add_argument("--drop-caches", action="store_true")
    p.add_argument("--output", type=Path, default=None)
    args = p.parse_args()
    config: dict[str, Any] = {
        **CONFIG,
        "hidden_size": args.hidden,
        "intermediate_size": args.hidden * 8 // 3 // 64 * 64,
        "num_attention_heads": args.hidden // 64,
        "num_key_value_heads": args.hidden // 64 // 4,
        "head_dim": 64,
        "num_hidden_layers": args.layers,
        "vocab_size": 32000,
    }
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        model = write_model(work / "model", config)
        size = sum(f.stat().st_size for f in model.glob("*.safetensors"))
        script = loader_script(work / "site", work)
        rounds = []
        try:
            for n in range(args.repeat):
                if args.drop_caches:
                    subprocess.run(["sync"], check=True)
                    Path("/proc/sys/vm/drop_caches").write_text("3\n")
                request = {"mode": "load", "model_dir": str(model), "reference_dir": str(model)}
                (rank,) = script.call({**request, "reference_first": n % 2 == 1})["ranks"]
                if rank["differ"]:
                    raise SystemExit(f"parameters differ between the loaders: {rank['differ'][:5]}")
                rounds.append({"strata_s": rank["strata_s"], "safetensors_s": rank["safetensors_s"]})
        finally:
            script.close()
    strata = min(r["strata_s"] for r in rounds)
    default = min(r["safetensors_s"] for r in rounds)
    result = {
        "bench": "vllm_loader",
        "vllm": "0.33.0 (CPU)",
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "model_bytes": size,
        "layers": args.layers,
        "hidden": args.hidden,
        "drop_caches": args.drop_caches,
        "rounds": rounds,
        "strata_load_model_s": strata,
        "safetensors_load_model_s": default,
        "ratio_safetensors_over_strata": default / strata,
    }
    print(json.dumps(result, indent=2))
    print(
        f"load_model of {size / 2**20:.0f} MiB: --load-format strata {strata:.2f}s, safetensors {default:.2f}s "
        f"(x{default / strata:.2f})"
    )
    if args.output:
        args.output.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
