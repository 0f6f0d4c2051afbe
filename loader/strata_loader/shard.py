"""Pre-sharding for tensor parallelism: one set of `model-rank-{rank}-part-{part}.safetensors` files per rank,
the layout vLLM's sharded loaders read, so each rank later loads only its own bytes.

Which dimension a weight splits along depends on the layer; the default rules cover Llama-family names
(column-parallel projections and embeddings on dim 0, row-parallel ones on dim 1, the rest replicated). Tensor
names are kept as in the source checkpoint.
"""

from __future__ import annotations

import fnmatch
import json
import os
from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors.torch import save_file

from .api import SafetensorsFile, load_files

SHARD_NAME = "model-rank-{rank}-part-{part}.safetensors"

DEFAULT_RULES: tuple[tuple[str, int | None], ...] = (
    ("*embed_tokens.weight", 0),
    ("*lm_head.weight", 0),
    ("*q_proj.*", 0), ("*k_proj.*", 0), ("*v_proj.*", 0), ("*qkv_proj.*", 0),
    ("*gate_proj.*", 0), ("*up_proj.*", 0), ("*gate_up_proj.*", 0),
    ("*o_proj.weight", 1), ("*down_proj.weight", 1),
)


def shard_dim(name: str, shape: Sequence[int], tp: int,
              rules: Sequence[tuple[str, int | None]] = DEFAULT_RULES) -> int | None:
    """The dimension `name` splits along for `tp` ranks, or None to replicate it."""
    for glob, dim in rules:
        if fnmatch.fnmatchcase(name, glob):
            if dim is None or dim >= len(shape) or shape[dim] % tp:
                return None  # e.g. fewer KV heads than ranks: every rank keeps the whole tensor
            return dim
    return None


def source_files(src: Path) -> list[Path]:
    return sorted(p for p in src.glob("*.safetensors") if not p.name.startswith("model-rank-"))


def shard_directory(src: Path, out: Path, tp: int, max_part_bytes: int,
                    rules: Sequence[tuple[str, int | None]] = DEFAULT_RULES) -> list[Path]:
    """Write every rank's parts into `out`, each part at most `max_part_bytes` (a bigger tensor gets its
    own)."""
    if tp < 1:
        raise ValueError(f"tensor-parallel size must be >= 1, got {tp}")
    files = source_files(src)
    if not files:
        raise FileNotFoundError(f"no .safetensors files in {src} to shard")
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    opened = [SafetensorsFile(f) for f in files]
    try:
        for rank in range(tp):
            part, size, dims = 0, 0, {}
            tensors: dict[str, torch.Tensor] = {}
            for sf in opened:
                for name in sf.keys():  # noqa: SIM118 -- not a dict
                    info = sf.info(name)
                    dim = shard_dim(name, info.shape, tp, rules)
                    if dim is None:
                        t = sf.get_tensor(name)
                    else:
                        t = sf.shard(name, dim, rank, tp)
                        dims[name] = dim
                    nbytes = t.numel() * t.element_size()
                    if tensors and size + nbytes > max_part_bytes:
                        written.append(_write(out, rank, part, tp, tensors, dims))
                        part, size, tensors, dims = part + 1, 0, {}, {}
                    tensors[name] = t
                    size += nbytes
            written.append(_write(out, rank, part, tp, tensors, dims))
    finally:
        for sf in opened:
            sf.close()
    return written


def _write(out: Path, rank: int, part: int, tp: int, tensors: dict[str, torch.Tensor],
           dims: dict[str, int]) -> Path:
    path = out / SHARD_NAME.format(rank=rank, part=part)
    tmp = path.with_name(path.name + ".tmp")
    meta = {"format": "pt", "strata.tp_size": str(tp), "strata.rank": str(rank),
            "strata.shard_dims": json.dumps(dims, sort_keys=True)}
    tmp.unlink(missing_ok=True)  # save_file opens by name: never through a link left under the temp name
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp), metadata=meta)
    os.replace(tmp, path)
    return path


def rank_files(directory: str | os.PathLike[str], rank: int) -> list[Path]:
    d = Path(directory)
    files = sorted(d.glob(f"model-rank-{rank}-part-*.safetensors"),
                   key=lambda p: int(p.stem.rsplit("-", 1)[-1]))
    if not files:
        raise FileNotFoundError(f"no model-rank-{rank}-part-*.safetensors files in {d}")
    return files


def load_rank(directory: str | os.PathLike[str], rank: int,
              device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """Load one rank's pre-sharded weights (all its parts at once)."""
    return load_files(rank_files(directory, rank), device=device)
