"""A captured cache's manifest: its key, and every file with its size and SHA-256, by path relative to the
generation's `files/` directory (`<root>/<path in that root>`, roots in `ROOTS`).

Written last into a generation before it is renamed into place; a restore trusts a file only when its bytes hash
to what the manifest says, so a truncated or flipped file is a miss, never a wrong kernel.
"""

from __future__ import annotations

import builtins
from typing import Final, Literal

from pydantic import BaseModel, Field, ValidationError, field_validator, model_validator

from ..core.messages import validation_error
from ..paths import UnsafePathError, safe_relative_path
from .key import CompileKey, CompileKeyError

VLLM_ROOT = "vllm"
"""`$VLLM_CACHE_ROOT/torch_compile_cache`: vLLM's per-config directories (`<hash>/rank_<r>_<dp>/<prefix>/`, with
`vllm_compile_cache.py`, `computation_graph.py` and, as vLLM 0.32 and 0.33 set TORCHINDUCTOR_CACHE_DIR there,
`inductor_cache/`), and with AOT compile `torch_aot_compile/<hash>/`."""
INDUCTOR_ROOT = "inductor"
"""`$TORCHINDUCTOR_CACHE_DIR` when it is set apart from vLLM's directory: what torch compiles before vLLM points
inductor into its own directory (and everything, with vLLM versions that do not)."""
ROOTS = (VLLM_ROOT, INDUCTOR_ROOT)

MANIFEST_VERSION: Final = 1


class CachedFile(BaseModel):
    path: str
    size: int = Field(ge=0)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")

    @field_validator("path")
    @classmethod
    def _clean(cls, v: str) -> str:
        """A restore joins these paths onto the engine's cache directories: only clean relative paths under a
        known root, never `..`, absolute or empty segments."""
        try:
            safe_relative_path(v)
        except UnsafePathError as e:
            raise ValueError(f"path {e}") from None
        root, sep, _ = v.partition("/")
        if not sep or root not in ROOTS:
            raise ValueError(f"path {v!r} is not under one of the roots {ROOTS}")
        return v


class CacheManifest(BaseModel):
    version: Literal[1] = MANIFEST_VERSION
    key: dict[str, str]
    created: str
    bytes: int = Field(ge=0)
    files: list[CachedFile]

    @model_validator(mode="after")
    def _consistent(self) -> CacheManifest:
        try:
            CompileKey(self.key)
        except CompileKeyError as e:
            raise ValueError(str(e)) from None
        if self.bytes != sum(f.size for f in self.files):
            raise ValueError(f"bytes {self.bytes} is not the sum of the files' sizes")
        paths = [f.path for f in self.files]
        if len(set(paths)) != len(paths):
            raise ValueError("a path is listed twice")
        return self

    @property
    def compile_key(self) -> CompileKey:
        return CompileKey(self.key)

    def same_files(self, other: CacheManifest) -> bool:
        return self.key == other.key and self.files == other.files

    def to_bytes(self) -> builtins.bytes:
        return self.model_dump_json(indent=1).encode()


class ManifestError(ValueError):
    """A manifest that cannot be trusted: the whole generation counts as absent."""


def parse_manifest(data: bytes, where: str) -> CacheManifest:
    try:
        return CacheManifest.model_validate_json(data)
    except ValidationError as e:
        why = validation_error(e.errors()[0], "manifest")
    raise ManifestError(f"{where} is not a valid compile cache manifest ({why})")
