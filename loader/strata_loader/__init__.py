"""Strata's model loader: a parallel safetensors streamer and the preloader CLI (`strata-loader`).

Swap one import: `from strata_loader import load_file` returns what `safetensors.torch.load_file` returns.
Names are imported lazily so the CLI's `fetch` and `verify` start without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .core.format import Header, SafetensorsError, TensorInfo, parse_header
    from .tensor.api import SafetensorsFile, TensorSlice, iter_tensors, load_file, load_files
    from .tensor.shard import load_rank

_WHERE = {
    "SafetensorsFile": "tensor.api",
    "TensorSlice": "tensor.api",
    "iter_tensors": "tensor.api",
    "load_file": "tensor.api",
    "load_files": "tensor.api",
    "Header": "core.format",
    "SafetensorsError": "core.format",
    "TensorInfo": "core.format",
    "parse_header": "core.format",
    "load_rank": "tensor.shard",
}

__all__ = [
    "Header",
    "SafetensorsError",
    "SafetensorsFile",
    "TensorInfo",
    "TensorSlice",
    "iter_tensors",
    "load_file",
    "load_files",
    "load_rank",
    "parse_header",
]


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
