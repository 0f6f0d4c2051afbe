"""`vllm serve --load-format strata`: vLLM's weights streamed by `strata_loader` into `model.load_weights`.

Registered through the `vllm.general_plugins` entry point (pyproject.toml), which vLLM loads in every process
that may build a model (EngineArgs, the engine core, each worker); `VLLM_PLUGINS` filters entry points by name
(`strata`). This is the only module of `strata_loader` that imports vLLM, and only a vLLM process imports it.

Weights come from the ModelCache's files (a local mount or S3, see `serving.LoaderOptions`). When the preloader
pre-sharded the cache for the engine's tensor-parallel size, a rank reads only its own parts: their tensors are
already this rank's slices, so vLLM's weight loaders are told not to slice them again (vLLM's own flag for such
weights, `is_sharded_weight`, and rank 0's offsets for its newer parameter classes); a slice that does not match
vLLM's partition fails vLLM's shape checks rather than loading wrong values.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch
from vllm.model_executor.model_loader import register_model_loader
from vllm.model_executor.model_loader.base_loader import BaseModelLoader

from ..core.sources import open_reader, read_header
from .serving import LoaderOptions, Selection, select_files

LOAD_FORMAT = "strata"

# Under vLLM's logger: vLLM gives it a handler in every process (no other logger has one there), so the line a load
# writes is in the engine's log, where a serving pod's `kubectl logs` shows which loader read the weights.
log = logging.getLogger(f"vllm.{__name__}")
_registered = False


def register() -> None:
    """The entry point. vLLM may call it many times per process (and in many processes): registers once."""
    global _registered
    if not _registered:
        register_model_loader(LOAD_FORMAT)(StrataModelLoader)
        _registered = True


def _tp() -> tuple[int, int]:
    from vllm.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 0, 1
    return parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size()


class StrataModelLoader(BaseModelLoader):
    """A `BaseModelLoader` for `--load-format strata`; options from `--model-loader-extra-config`."""

    def __init__(self, load_config: Any) -> None:
        super().__init__(load_config)
        self.options = LoaderOptions.from_extra(load_config.model_loader_extra_config)
        self.stats: dict[str, Any] = {}
        """What the last `load_weights` read: files, tensors, bytes, seconds, whether pre-sharded."""

    def _select(self, model_config: Any) -> Selection:
        model = getattr(model_config, "model_weights", None) or model_config.model
        source = self.options.resolve_source(str(model))
        rank, size = _tp()
        selection = select_files(source, self.options, rank, size)
        if selection.presharded:
            _check_parts(selection.files, rank, size)
        return selection

    def download_model(self, model_config: Any) -> None:
        """Nothing to download (the ModelCache holds the files); checks that this rank's files are there."""
        self._select(model_config)

    def load_weights(self, model: Any, model_config: Any) -> None:
        from ..tensor.api import iter_tensors

        selection = self._select(model_config)
        counted = {"tensors": 0, "bytes": 0}

        def weights() -> Iterator[tuple[str, torch.Tensor]]:
            for name, tensor in iter_tensors(
                selection.files,
                "cpu",
                copy=True,  # models may keep a weight past the next one (stacked experts): each owns its memory
                memory_limit=self.options.memory_limit,
                batch_bytes=self.options.batch_bytes,
                block_size=self.options.block_size,
                concurrency=self.options.concurrency,
            ):
                counted["tensors"] += 1
                counted["bytes"] += tensor.numel() * tensor.element_size()
                yield name, tensor

        start = time.perf_counter()
        with _rank_local(model) if selection.presharded else contextlib.nullcontext():
            model.load_weights(weights())
        self.stats = {
            "files": list(selection.files),
            "presharded": selection.presharded,
            **counted,
            "seconds": time.perf_counter() - start,
        }
        log.info(
            "strata loader: %d tensors, %d bytes from %d file(s)%s in %.2fs",
            counted["tensors"],
            counted["bytes"],
            len(selection.files),
            " (this rank's pre-sharded parts)" if selection.presharded else "",
            self.stats["seconds"],
        )


def _check_parts(files: list[str], rank: int, size: int) -> None:
    """The parts say which rank of which tensor-parallel size they were cut for (`tensor.shard._write_part`)."""
    reader = open_reader(files[0])
    try:
        meta = read_header(reader).metadata or {}
    finally:
        reader.close()
    if meta.get("strata.tp_size") != str(size) or meta.get("strata.rank") != str(rank):
        raise ValueError(
            f"--load-format strata: {files[0]} was cut for rank {meta.get('strata.rank')} of tensor-parallel size "
            f"{meta.get('strata.tp_size')}, not rank {rank} of {size}; re-run the preloader's shard step, or set "
            "model_loader_extra_config.sharded to 'never'"
        )


@contextlib.contextmanager
def _rank_local(model: torch.nn.Module) -> Iterator[None]:
    """While loading pre-sharded parts: vLLM's weight loaders take each tensor as this rank's slice as is."""
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from vllm.model_executor.parameter import BasevLLMParameter

    undo: list[tuple[Any, str, Any]] = []

    def set_attr(obj: Any, name: str, value: Any) -> None:
        undo.append((obj, name, getattr(obj, name, _MISSING)))
        setattr(obj, name, value)

    try:
        for module in model.modules():
            params: list[Any] = list(module.parameters(recurse=False))  # vLLM's weight attributes are untyped
            for param in params:
                if isinstance(module, VocabParallelEmbedding) and getattr(param, "output_dim", None) is not None:
                    set_attr(param, "weight_loader", _padded_vocab_loader(module, param.weight_loader))
                elif isinstance(param, BasevLLMParameter):
                    set_attr(param, "tp_rank", 0)
                else:
                    set_attr(param, "is_sharded_weight", True)
        yield
    finally:
        for obj, name, old in reversed(undo):
            if old is _MISSING:
                delattr(obj, name)
            else:
                setattr(obj, name, old)


_MISSING = object()


def _padded_vocab_loader(module: Any, load: Any) -> Any:
    """vLLM's vocabulary-parallel loader takes the whole vocabulary and cuts this rank's rows
    [org_vocab_start_index, org_vocab_end_index) from it: hand it a tensor of the whole vocabulary's shape with
    this rank's rows in place (the other rows are never read, so they are left unwritten)."""
    start = module.shard_indices.org_vocab_start_index
    end = module.shard_indices.org_vocab_end_index

    def loader(param: torch.Tensor, loaded: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        dim = param.output_dim  # type: ignore[attr-defined]
        if dim != 0 or loaded.shape[0] != end - start or start != module.tp_rank * loaded.shape[0]:
            raise ValueError(
                f"--load-format strata: a pre-sharded vocabulary slice of {loaded.shape[0]} rows does not match "
                f"vLLM's partition (rows {start}..{end} of {module.org_vocab_size} on rank {module.tp_rank}); "
                "set model_loader_extra_config.sharded to 'never'"
            )
        whole = loaded.new_empty((module.org_vocab_size, *loaded.shape[1:]))
        whole[start:end].copy_(loaded)
        return load(param, whole, *args, **kwargs)

    return loader
