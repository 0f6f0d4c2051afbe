"""`<name>-connection`: everything a vLLM pod needs to use the tier, as environment variables.

A serving pod takes it with `envFrom: [{configMapRef: {name: <name>-connection}}]` and passes
`--kv-transfer-config "$(KV_TRANSFER_CONFIG)" --prefix-caching-hash-algo "$(PREFIX_CACHING_HASH_ALGO)"` (the webhook
appends both when asked). Engines that share chunks must hash blocks alike: the same algorithm, and for the xxhash
variants (whose seed vLLM otherwise draws at random per process) the same PYTHONHASHSEED. With sha256 variants
PYTHONHASHSEED is left unset on purpose: vLLM then seeds from its fixed default, as every vLLM not wired by Strata
does, so they share chunks too (a PYTHONHASHSEED set here would silently split them off; vLLM's
`resolve_none_hash_seed`). LMCache hashes with Python's `hash()` by default, so its connector always gets the seed.
"""

from __future__ import annotations

import json
from typing import Any

from strata_operator.api.kvcachetier import ConnectorType, EngineDevice, HashAlgorithm, KVCacheTierSpec
from strata_operator.resources.kvcachetier.auth import token_secret
from strata_operator.resources.kvcachetier.config import hash_seed
from strata_operator.resources.kvcachetier.names import TierRef, memory_quantity
from strata_operator.resources.kvcachetier.node_socket import NODE_SOCKET_PATH
from strata_operator.resources.kvcachetier.service import events_url, service_host

KV_ROLE = "kv_both"
"""Every engine both stores into and loads from the shared tier."""
LMCACHE_CONNECTOR = "LMCacheConnectorV1"
VLLM_CONNECTOR = "OffloadingConnector"
VLLM_SPEC = "TieringOffloadingSpec"
CPU_ENGINE_SPEC = "StrataCPUOffloadingSpec"
CPU_ENGINE_SPEC_MODULE = "strata_kv.vllm_cpu_offload"
"""vLLM's OffloadingConnector refuses the CPU platform; engines on CPU load Strata's spec by `spec_module_path`."""
TRANSFER_CONFIG_ENV = {EngineDevice.GPU: "KV_TRANSFER_CONFIG_GPU", EngineDevice.CPU: "KV_TRANSFER_CONFIG_CPU"}
"""The per-engine variants of KV_TRANSFER_CONFIG (vllm connector), which a pod picks with strata.dev/kv-engine."""
VLLM_TIER_CLASS = "StrataTier"
VLLM_TIER_MODULE = "strata_kv.vllm_tier"
"""Where vLLM imports the tier from (`module_path`): in `pip install strata`, importable without extras. Both module
paths are strata_kv's entry modules, kept where they are whatever release the serving image holds."""
TOKEN_ENV = "STRATA_KV_TOKEN"
"""The variable the tier reads its AUTH token from; the webhook sets it from the tier's token Secret."""
SHM_HEADROOM_BYTES = 1024**3
"""/dev/shm beyond vLLM's CPU tier: its mp executor and NCCL keep their own segments there."""
NON_CRYPTO_HASHES = {HashAlgorithm.XXHASH, HashAlgorithm.XXHASH_CBOR}
CPU_RESERVED_CORES_ENV = "VLLM_CPU_NUM_OF_RESERVED_CPU"
CPU_RESERVED_CORES = "1"
"""Cores a CPU engine keeps off its OpenMP threads: one, for its scheduler process, as without a connector.

vLLM 0.32/0.33 reserve one more core whenever any `--kv-transfer-config` is set (`OMPProcessManager`: "for
nixl_connector under p/d case"). Strata's connector needs none: its CPU spec copies blocks on the worker's own
thread and its tier's I/O threads wait in the scheduler process, on the core already kept for it. The extra core
costs 1/N of the prefill's threads, and where reserving it would leave none (2 cores) vLLM reserves nothing at all,
so the scheduler's spin-wait runs on the OpenMP threads' cores: on 2 cores a prompt that missed the tier took 2.1x
as long to its first token as with no connector (bench/vllm_cpu_ttft.py, sides none and cpu). GPU engines do not
read it."""


def remote_url(spec: KVCacheTierSpec, tier: TierRef) -> str:
    """The node-local Service as a RESP URL (LMCache's remote backend and Strata's tier both take it)."""
    return f"redis://{service_host(tier)}:{spec.port}"


def _vllm_transfer_config(spec: KVCacheTierSpec, tier: TierRef, engine: EngineDevice) -> dict[str, Any]:
    strata_tier: dict[str, Any] = {
        "type": VLLM_TIER_CLASS,
        "module_path": VLLM_TIER_MODULE,
        "url": remote_url(spec, tier),
    }
    if spec.node_socket.enabled:
        strata_tier["unix_socket"] = NODE_SOCKET_PATH  # used when mounted (the webhook does), else the url
    if token_secret(spec, tier) is not None:
        strata_tier["token_env"] = TOKEN_ENV
    spec_name = {"spec_name": VLLM_SPEC}
    if engine == EngineDevice.CPU:
        spec_name = {"spec_name": CPU_ENGINE_SPEC, "spec_module_path": CPU_ENGINE_SPEC_MODULE}
    extra = {
        **spec_name,
        "cpu_bytes_to_use": int(spec.connector.cpu_bytes),
        "block_size": spec.chunk_tokens,
        "offload_prompt_only": spec.connector.offload_prompt_only,
        "secondary_tiers": [strata_tier],
    }
    # A chunk the tier loses between lookup and load is recomputed; vLLM's default ("fail") would fail the request.
    return {
        "kv_connector": VLLM_CONNECTOR,
        "kv_role": KV_ROLE,
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": extra,
    }


def _lmcache_transfer_config(spec: KVCacheTierSpec, tier: TierRef) -> dict[str, Any]:
    extra: dict[str, Any] = {
        "lmcache.remote_url": remote_url(spec, tier),
        "lmcache.remote_serde": "naive",
        "lmcache.chunk_size": spec.chunk_tokens,
    }
    return {"kv_connector": LMCACHE_CONNECTOR, "kv_role": KV_ROLE, "kv_connector_extra_config": extra}


def build_kv_transfer_config(
    spec: KVCacheTierSpec, tier: TierRef, engine: EngineDevice | None = None
) -> dict[str, Any]:
    """The complete `--kv-transfer-config` object for the spec's connector, for engines on `engine` (default: the
    spec's `connector.engine`)."""
    if spec.connector.type == ConnectorType.LMCACHE:
        return _lmcache_transfer_config(spec, tier)
    return _vllm_transfer_config(spec, tier, engine or spec.connector.engine)


def client_shm_size(spec: KVCacheTierSpec) -> str | None:
    """The /dev/shm size limit a serving pod needs: `clientShmSize`, else (vllm) the CPU tier plus headroom."""
    if spec.client_shm_size is not None:
        return str(spec.client_shm_size.spelling)
    if spec.connector.type == ConnectorType.VLLM:
        return memory_quantity(spec.connector.cpu_bytes + SHM_HEADROOM_BYTES)
    return None


def needs_hash_seed(spec: KVCacheTierSpec) -> bool:
    return (
        spec.connector.type == ConnectorType.LMCACHE
        or spec.hash.algorithm in NON_CRYPTO_HASHES
        or spec.hash.seed is not None
    )


def build_connection_env(spec: KVCacheTierSpec, tier: TierRef) -> dict[str, str]:
    def compact(config: dict[str, Any]) -> str:
        return json.dumps(config, separators=(",", ":"))

    env = {
        "KV_TRANSFER_CONFIG": compact(build_kv_transfer_config(spec, tier)),
        "PREFIX_CACHING_HASH_ALGO": spec.hash.algorithm.value,
        "STRATA_KV_URL": remote_url(spec, tier),
        "STRATA_KV_CHUNK_TOKENS": str(spec.chunk_tokens),
    }
    if needs_hash_seed(spec):
        env["PYTHONHASHSEED"] = hash_seed(spec, tier)
    if spec.node_socket.enabled:
        env["STRATA_KV_SOCKET"] = NODE_SOCKET_PATH
    if (events := events_url(spec, tier)) is not None:
        env["STRATA_KV_EVENTS_URL"] = events
    if (shm := client_shm_size(spec)) is not None:
        env["STRATA_KV_SHM_SIZE"] = shm
    if spec.connector.type == ConnectorType.VLLM:
        for engine, name in TRANSFER_CONFIG_ENV.items():
            env[name] = compact(build_kv_transfer_config(spec, tier, engine))
        env[CPU_RESERVED_CORES_ENV] = CPU_RESERVED_CORES
    if spec.connector.type == ConnectorType.LMCACHE:
        env["LMCACHE_CHUNK_SIZE"] = str(spec.chunk_tokens)
        env["LMCACHE_REMOTE_URL"] = remote_url(spec, tier)
        env["LMCACHE_REMOTE_SERDE"] = "naive"
    if spec.tenancy.cache_salt:
        env["STRATA_KV_CACHE_SALT"] = spec.tenancy.cache_salt
    if (token := token_secret(spec, tier)) is not None:
        # Names only: a client pod takes the token itself with env[].valueFrom.secretKeyRef (the webhook does so).
        env["STRATA_KV_AUTH_SECRET"] = token.name
        env["STRATA_KV_AUTH_SECRET_KEY"] = token.key
    return env


def build_connection_config_map(spec: KVCacheTierSpec, tier: TierRef) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": tier.metadata(tier.connection_config_map),
        "data": build_connection_env(spec, tier),
    }
