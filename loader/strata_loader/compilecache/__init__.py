"""The engine's compile cache, kept with the model: `key` (what must match for a cache to be reused), `store`
(generations of captured caches, verified on restore), `command` (`strata-loader compile ...`).

The store and the CLI need only the standard library and pydantic; `probe` (the engine's key) runs in the
engine's own interpreter, where vLLM and torch are importable."""

from .key import KEY_PARTS, CompileKey, CompileKeyError
from .manifest import INDUCTOR_ROOT, ROOTS, VLLM_ROOT
from .store import CacheMiss, CaptureError, CompileStore, StoreFullError

__all__ = [
    "INDUCTOR_ROOT",
    "KEY_PARTS",
    "ROOTS",
    "VLLM_ROOT",
    "CacheMiss",
    "CaptureError",
    "CompileKey",
    "CompileKeyError",
    "CompileStore",
    "StoreFullError",
]
