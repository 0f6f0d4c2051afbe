"""What the vLLM loader plugin (`plugin`) decides without vLLM: its options and which files a rank reads.

Kept apart from the plugin so that it is testable in any environment: nothing here imports vLLM or torch.

A rank reads the ModelCache's pre-sharded parts (`<source>/<sharded_subdir>/model-rank-<rank>-part-<n>.safetensors`,
what the preloader's `shard` option writes) when the directory holds a complete set for the engine's
tensor-parallel size, and every `*.safetensors` file of the source otherwise.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from ..contract import DEFAULT_BLOCK_SIZE, DEFAULT_MEMORY_LIMIT
from ..tensor.planner import DEFAULT_BATCH_BYTES
from ..tensor.shard import SHARD_NAME

MODEL_DIR_ENV = "STRATA_MODEL_DIR"
"""Set by the pod admission webhook to the ModelCache's mount path (operator `webhook/wiring.py`)."""


@dataclass(frozen=True, slots=True)
class LoaderOptions:
    """`--model-loader-extra-config` of `--load-format strata`. Every key has a default; an unknown key is an
    error, since a misspelt one would otherwise be ignored silently."""

    source: str | None = None
    """A directory or `s3://bucket/prefix`; default: `--model` when it is a local directory or an s3:// URI, else
    $STRATA_MODEL_DIR."""
    sharded: str = "auto"
    """`auto` (the rank's pre-sharded parts when a complete set for this tensor-parallel size exists), `never`,
    or `require` (an error when there is none)."""
    sharded_subdir: str = "sharded"
    concurrency: int | None = None
    """Parallel reads; default 4 for local files, more for S3 (`core.concurrency.concurrency_for`)."""
    block_size: int = DEFAULT_BLOCK_SIZE
    batch_bytes: int = DEFAULT_BATCH_BYTES
    memory_limit: int = DEFAULT_MEMORY_LIMIT
    """Read-ahead buffers held at once."""

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> LoaderOptions:
        extra = dict(extra or {})
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(extra) - set(known))
        if unknown:
            raise ValueError(
                f"--model-loader-extra-config for --load-format strata: unknown key(s) {unknown}; "
                f"the keys are {sorted(known)}"
            )
        for key in ("source", "sharded_subdir", "sharded"):
            if key in extra and extra[key] is not None and not isinstance(extra[key], str):
                raise ValueError(f"--model-loader-extra-config: {key} must be a string, got {extra[key]!r}")
        if extra.get("sharded", "auto") not in ("auto", "never", "require"):
            raise ValueError(
                f"--model-loader-extra-config: sharded must be 'auto', 'never' or 'require', got {extra['sharded']!r}"
            )
        for key in ("concurrency", "block_size", "batch_bytes", "memory_limit"):
            value = extra.get(key)
            if key in extra and not (_positive_int(value) or (key == "concurrency" and value is None)):
                raise ValueError(f"--model-loader-extra-config: {key} must be a positive integer, got {value!r}")
        return cls(**extra)

    def resolve_source(self, model: str) -> str:
        """Where the weights are: the `source` option, else `--model` when it names a directory or S3, else the
        ModelCache mount the webhook announced."""
        if self.source:
            where = self.source
        elif model.startswith("s3://") or os.path.isdir(model):
            where = model
        elif os.environ.get(MODEL_DIR_ENV):
            where = os.environ[MODEL_DIR_ENV]
        else:
            raise ValueError(
                f"--load-format strata: --model {model!r} is neither a directory nor an s3:// URI and "
                f"${MODEL_DIR_ENV} is not set; set model_loader_extra_config.source, or mount a ModelCache "
                "(the webhook sets the variable)"
            )
        if not where.startswith("s3://") and not os.path.isdir(where):
            raise FileNotFoundError(
                f"--load-format strata: model directory {where} does not exist; check the ModelCache mount "
                f"(${MODEL_DIR_ENV}) or model_loader_extra_config.source"
            )
        return where.rstrip("/") if where.startswith("s3://") else where


def _positive_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


@dataclass(frozen=True, slots=True)
class Selection:
    files: list[str]
    presharded: bool


def select_files(source: str, options: LoaderOptions, rank: int, tp_size: int) -> Selection:
    """The files rank `rank` of `tp_size` reads from `source`."""
    names = _listing(source)
    if options.sharded != "never":
        sub = f"{options.sharded_subdir.strip('/')}/"
        parts = {n[len(sub) :] for n in names if n.startswith(sub)}
        mine = _rank_parts(parts, rank)
        complete = mine and all(_rank_parts(parts, r) for r in range(tp_size)) and not _rank_parts(parts, tp_size)
        if complete:
            return Selection([_join(source, sub + n) for n in mine], True)
        if options.sharded == "require":
            have = sorted({n.split("-part-")[0] for n in parts if n.startswith("model-rank-")})
            raise FileNotFoundError(
                f"--load-format strata: sharded=require but {_join(source, sub)} has no complete set of parts for "
                f"tensor-parallel size {tp_size} (found {have or 'none'}); re-run the preloader with "
                f"preload.shard.tensorParallelSize={tp_size}, or set sharded to 'auto'"
            )
    files = [n for n in names if "/" not in n and n.endswith(".safetensors") and not n.startswith("model-rank-")]
    if not files:
        raise FileNotFoundError(f"--load-format strata: no .safetensors files in {source}")
    return Selection([_join(source, n) for n in files], False)


def _rank_parts(parts: set[str], rank: int) -> list[str]:
    prefix = SHARD_NAME.format(rank=rank, part="")[: -len(".safetensors")]
    mine = [n for n in parts if n.startswith(prefix) and n.endswith(".safetensors") and "/" not in n]
    return sorted(mine, key=lambda n: int(n[len(prefix) : -len(".safetensors")]))


def _join(source: str, name: str) -> str:
    return f"{source}/{name}" if source.startswith("s3://") else str(Path(source) / name)


def _listing(source: str) -> list[str]:
    """Names relative to `source`: the top level and one level below (the sharded parts' directory)."""
    if source.startswith("s3://"):
        from ..core.s3 import list_objects, split_uri

        bucket, prefix = split_uri(source + "/")
        return [o.key[len(prefix) :] for o in list_objects(bucket, prefix)]
    root = Path(source)
    out = [p.name for p in root.glob("*.safetensors")]
    out += [f"{d.name}/{p.name}" for d in root.iterdir() if d.is_dir() for p in d.glob("*.safetensors")]
    return sorted(out)
