"""When an engine's compile output is complete: the compiler has written the file it writes last, and nothing
under the cache directories has changed for a quiet period.

Which file that is depends on who compiles:
- vLLM's own compiler (`CompilationMode.VLLM_COMPILE`, the GPU default) writes everything under its per-config
  directory `rank_<r>_<dp>/`, inductor's cache included, and `vllm_compile_cache.py` there once all of a model's
  graphs are compiled (`CompilerManager.save_to_file`, vLLM 0.32 and 0.33); with AOT compile on, the artifact is
  `torch_aot_compile/<hash>/rank_<r>_<dp>/model`. Inductor's entries appear there piece by piece long before, so
  while vLLM's directory exists only its completion file counts.
- Stock torch.compile (`DYNAMO_TRACE_ONCE`, what vLLM uses on CPU) never makes that directory: inductor writes into
  TORCHINDUCTOR_CACHE_DIR, and an FX graph entry (`fxgraph/<2>/<key>/<file>`) or AOTAutograd entry
  (`aotautograd/<key>/<file>`) is written once a graph is compiled. Before this was counted, a CPU engine's
  sidecar waited for a file that never comes and captured nothing.
Inductor may still finish other files after that (and compiles more sizes later), so the tree must also be stable:
the same files, sizes and modification times for `quiet_s`.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from .manifest import VLLM_ROOT
from .tree import TreeFile, walk

COMPLETION_FILES = (
    re.compile(r"^(?:.+/)?rank_[0-9]+_[0-9]+/(?:.+/)?vllm_compile_cache\.py$"),
    re.compile(r"^torch_aot_compile/[^/]+/rank_[0-9]+_[0-9]+/model$"),
)
"""Paths under `$VLLM_CACHE_ROOT/torch_compile_cache` that vLLM writes when a compile is done."""
VLLM_COMPILE_DIR = re.compile(r"^(?:.+/)?rank_[0-9]+_[0-9]+/")
"""A file under it: vLLM's own compiler is at work, and only its completion file says it is done."""
TORCH_CACHE_ENTRIES = (
    re.compile(r"^(?:.+/)?fxgraph/[^/]+/[^/]+/[^/]+$"),
    re.compile(r"^(?:.+/)?aotautograd/[^/]+/[^/]+$"),
)
"""Inductor's FX graph and AOTAutograd cache entries (torch 2.x `FxGraphCache`, `AOTAutogradCache`), in any root."""

Snapshot = tuple[tuple[str, tuple[TreeFile, ...]], ...]


def snapshot(sources: Mapping[str, Path]) -> Snapshot:
    return tuple((name, tuple(walk(path))) for name, path in sorted(sources.items()))


def is_complete(snap: Snapshot) -> bool:
    """Whether vLLM's completion file is among the files or, where vLLM compiles nothing of its own, a torch
    cache entry is."""
    vllm_files = [f.path for name, files in snap if name == VLLM_ROOT for f in files]
    if any(p.match(path) for path in vllm_files for p in COMPLETION_FILES):
        return True
    if any(VLLM_COMPILE_DIR.match(path) for path in vllm_files):
        return False
    return any(p.match(f.path) for _, files in snap for f in files for p in TORCH_CACHE_ENTRIES)


def wait_until_complete(
    sources: Mapping[str, Path],
    quiet_s: float,
    poll_s: float,
    timeout_s: float,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """Poll until the compile is complete and the trees have not changed for `quiet_s`; False after `timeout_s`."""
    deadline = clock() + timeout_s
    last: Snapshot | None = None
    since = clock()
    while True:
        now = clock()
        snap = snapshot(sources)
        if snap != last:
            last, since = snap, now
        elif is_complete(snap) and now - since >= quiet_s:
            return True
        if now >= deadline:
            return False
        sleep(poll_s)
