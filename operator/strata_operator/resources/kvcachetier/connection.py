"""`<name>-connection`: everything a vLLM pod needs to use the tier, as environment variables.

A serving pod takes it with `envFrom: [{configMapRef: {name: <name>-connection}}]` and passes
`--kv-transfer-config "$(KV_TRANSFER_CONFIG)"`. PYTHONHASHSEED travels with it because engines whose
hash seeds differ compute different block hashes and silently never hit (LMCache #1139, #2136).
"""

from __future__ import annotations

import json
from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.auth import token_secret
from strata_operator.resources.kvcachetier.config import hash_seed
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.service import service_host

KV_CONNECTOR = "LMCacheConnectorV1"
KV_ROLE = "kv_both"
"""Every engine both stores into and loads from the shared tier."""


def remote_url(spec: KVCacheTierSpec, tier: TierRef) -> str:
    """LMCache's RESP remote backend URL for the node-local Service."""
    return f"redis://{service_host(tier)}:{spec.port}"


def build_kv_transfer_config(spec: KVCacheTierSpec, tier: TierRef) -> dict[str, Any]:
    """The `--kv-transfer-config` object: LMCache's connector, configured through `lmcache.*` extras."""
    extra: dict[str, Any] = {
        "lmcache.remote_url": remote_url(spec, tier),
        "lmcache.remote_serde": "naive",
        "lmcache.chunk_size": spec.chunk_tokens,
    }
    return {"kv_connector": KV_CONNECTOR, "kv_role": KV_ROLE, "kv_connector_extra_config": extra}


def build_connection_env(spec: KVCacheTierSpec, tier: TierRef) -> dict[str, str]:
    env = {
        "KV_TRANSFER_CONFIG": json.dumps(build_kv_transfer_config(spec, tier), separators=(",", ":")),
        "PYTHONHASHSEED": hash_seed(spec, tier),
        "STRATA_KV_URL": remote_url(spec, tier),
        "STRATA_KV_HASH_ALGORITHM": spec.hash.algorithm.value,
        "STRATA_KV_CHUNK_TOKENS": str(spec.chunk_tokens),
        "LMCACHE_CHUNK_SIZE": str(spec.chunk_tokens),
        "LMCACHE_REMOTE_URL": remote_url(spec, tier),
        "LMCACHE_REMOTE_SERDE": "naive",
    }
    if spec.tenancy.cache_salt:
        env["STRATA_KV_CACHE_SALT"] = spec.tenancy.cache_salt
    if (token := token_secret(spec, tier)) is not None:
        # Names only: a client pod takes the token itself with env[].valueFrom.secretKeyRef.
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
