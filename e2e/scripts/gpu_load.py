"""Runs in the cluster on the GPU node: loads the ModelCache's files onto the GPU with Strata's loader and
prints each tensor's digest (computed back on the host) and where it lives, as JSON."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import torch
from strata_loader import load_file


def main() -> None:
    files = sorted(Path(os.environ["MODEL_DIR"]).rglob("*.safetensors"))
    if not files:
        raise SystemExit(f"no .safetensors under {os.environ['MODEL_DIR']}")
    if not torch.cuda.is_available():
        raise SystemExit("torch sees no CUDA device in this pod")
    loaded = {}
    for file in files:
        loaded.update(load_file(file, device="cuda:0"))
    report = {
        "devices": sorted({str(t.device) for t in loaded.values()}),
        "gpu": torch.cuda.get_device_name(0),
        "tensors": {
            name: hashlib.sha256(t.cpu().contiguous().numpy().tobytes()).hexdigest() for name, t in loaded.items()
        },
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
