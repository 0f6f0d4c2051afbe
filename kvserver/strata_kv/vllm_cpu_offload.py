"""The name vLLM imports Strata's CPU offloading spec by (`"spec_module_path": "strata_kv.vllm_cpu_offload"`).

Kept at the top of the package because users and the operator's connection ConfigMap name this path in the
engine's configuration, and a serving image may carry another release of `strata` than the operator: the path
stays while the code lives in `strata_kv.vllm.cpu_offload`.
"""

from .vllm.cpu_offload import StrataCPUOffloadingSpec, StrataCPUOffloadingWorker

__all__ = ["StrataCPUOffloadingSpec", "StrataCPUOffloadingWorker"]
