"""The name vLLM imports Strata's tier by (`"module_path": "strata_kv.vllm_tier"` in `--kv-transfer-config`).

Kept at the top of the package because users and the operator's connection ConfigMap name this path in the
engine's configuration, and a serving image may carry another release of `strata` than the operator: the path
stays while the code lives in `strata_kv.vllm.tier`.
"""

from .vllm.tier import DEFAULT_TOKEN_ENV, DEFAULT_URL, StrataTier, namespace_prefix

__all__ = ["DEFAULT_TOKEN_ENV", "DEFAULT_URL", "StrataTier", "namespace_prefix"]
