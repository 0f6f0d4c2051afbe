"""When an engine's compile output is complete: vLLM has written its completion file and nothing under the cache
directories has changed for a quiet period.

vLLM writes `vllm_compile_cache.py` (`rank_<r>_<dp>/<prefix>/`) once all of a model's graphs are compiled
(`CompilerManager.save_to_file`, vLLM 0.32 and 0.33); with AOT compile on, the artifact is
`torch_aot_compile/<hash>/rank_<r>_<dp>/model`. Inductor may still finish other files after that (and compiles
more sizes later), so the tree must also be stable: the same files, sizes and modification times for `quiet_s`.
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

Snapshot = tuple[tuple[str, tuple[TreeFile, ...]], ...]


def snapshot(sources: Mapping[str, Path]) -> Snapshot:
    return tuple((name, tuple(walk(path))) for name, path in sorted(sources.items()))


def is_complete(snap: Snapshot) -> bool:
    """Whether vLLM's completion file is among the files."""
    for name, files in snap:
        if name == VLLM_ROOT and any(p.match(f.path) for f in files for p in COMPLETION_FILES):
            return True
    return False


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
