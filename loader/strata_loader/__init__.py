"""Strata's model loader: a parallel safetensors streamer and the preloader CLI (`strata-loader`).

Swap one import: `from strata_loader import load_file` returns what `safetensors.torch.load_file` returns.
"""

from .api import SafetensorsFile, TensorSlice, iter_tensors, load_file, load_files
from .format import Header, SafetensorsError, TensorInfo, parse_header
from .shard import load_rank

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
