"""Models the tests generate: small, deterministic, with what real ones have (several safetensors shards in
several dtypes, a config, a nested tokenizer file)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

WEIGHTS = 3 * 2**20 + 17
"""Not a multiple of a tar block: layer padding is exercised."""


def write_raw_model(root: Path, config: str = '{"model_type": "tiny"}', *, reverse: bool = False) -> dict[str, bytes]:
    """Two weight files (plain bytes: no torch needed), a config and a nested small file, written in sorted order
    or its `reverse` (creation order must not matter to whoever reads the directory). Returns path -> bytes."""
    files = {
        "model-00001-of-00002.safetensors": bytes(range(256)) * (WEIGHTS // 256) + b"x" * (WEIGHTS % 256),
        "model-00002-of-00002.safetensors": b"\x01" * (2 * 2**20),
        "config.json": config.encode(),
        "tokenizer/special_tokens.json": b'{"bos": "<s>"}',
    }
    for name in sorted(files, reverse=reverse):
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(files[name])
    return files


def safetensors_model(files: int = 2, tensor_bytes: int = 1 << 20) -> tuple[dict[str, bytes], dict[str, str]]:
    """A generated safetensors model (bf16, f32 and u8 tensors, seeded) and its config: (path -> bytes, tensor
    name -> sha256 of its bytes)."""
    import torch
    from safetensors.torch import save

    contents: dict[str, bytes] = {}
    digests: dict[str, str] = {}
    generator = torch.Generator().manual_seed(7)
    for index in range(files):
        tensors = {
            f"layers.{index}.weight": torch.randn(tensor_bytes // 2, generator=generator).to(torch.bfloat16),
            f"layers.{index}.bias": torch.randn(tensor_bytes // 4, generator=generator),
            f"layers.{index}.scale": torch.randint(0, 255, (4096,), dtype=torch.uint8, generator=generator),
        }
        for name, tensor in tensors.items():
            digests[name] = hashlib.sha256(tensor.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest()
        contents[f"model-{index + 1:05d}-of-{files:05d}.safetensors"] = save(tensors)
    contents["config.json"] = json.dumps({"model_type": "tiny"}).encode()
    return contents, digests
