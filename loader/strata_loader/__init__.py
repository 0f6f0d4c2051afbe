"""Strata's model loader: a parallel safetensors streamer and the preloader CLI (`strata-loader`).

Swap one import: `from strata_loader import load_file` returns what `safetensors.torch.load_file` returns.
Names are imported lazily so the CLI's `fetch` and `verify` start without loading torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .api import SafetensorsFile, TensorSlice, iter_tensors, load_file, load_files
    from .format import Header, SafetensorsError, TensorInfo, parse_header
    from .shard import load_rank

_WHERE = {
    "SafetensorsFile": "api",
    "TensorSlice": "api",
    "iter_tensors": "api",
    "load_file": "api",
    "load_files": "api",
    "Header": "format",
    "SafetensorsError": "format",
    "TensorInfo": "format",
    "parse_header": "format",
    "load_rank": "shard",
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
