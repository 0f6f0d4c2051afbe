"""The servers' config ConfigMap, rendered from the model the server parses (`strata_kv.config`)."""

from __future__ import annotations

import hashlib
from typing import Any

from strata_kv.config import (
    CONFIG_FILE_NAME,
    AuthConfig,
    EventMedia,
    EventsConfig,
    EvictionPolicyName,
    KVServerConfig,
    L1Config,
    L2Config,
    L2FsConfig,
    L2S3Config,
    LimitsConfig,
    ListenConfig,
    MetricsConfig,
    NamespaceConfig,
    TenancyConfig,
)

from strata_operator.api.kvcachetier import KVCacheTierSpec, L2Spec
from strata_operator.resources.core import stable_hash
from strata_operator.resources.kvcachetier.auth import token_secret
from strata_operator.resources.kvcachetier.names import (
    AUTH_DIR,
    AUTH_FILE,
    L2_FS_ROOT,
    TierRef,
)
from strata_operator.resources.kvcachetier.node_socket import NODE_SOCKET_MODE, NODE_SOCKET_PATH


def hash_seed(spec: KVCacheTierSpec, tier: TierRef) -> str:
    """The PYTHONHASHSEED every engine and server shares: the spec's, or one stable per resource.

    Deriving it from namespace/name (not the uid) keeps it stable when a GitOps tool recreates the resource.
    """
    if spec.hash.seed is not None:
        return spec.hash.seed
    digest = hashlib.sha256(f"{tier.namespace}/{tier.name}".encode()).digest()
    return str(int.from_bytes(digest[:4], "big"))


def _l2_config(l2: L2Spec | None) -> L2Config:
    if l2 is None:
        return L2Config()
    fs = None
    if l2.fs is not None:
        fs = L2FsConfig(
            root_dir=L2_FS_ROOT,
            capacity=l2.fs.capacity,
            high_watermark=l2.fs.high_watermark_percent / 100,
            low_watermark=l2.fs.low_watermark_percent / 100,
        )
    s3 = None
    if l2.s3 is not None:
        style = l2.s3.addressing_style.value if l2.s3.addressing_style else ("path" if l2.s3.endpoint else "auto")
        s3 = L2S3Config.model_validate(
            {
                "bucket": l2.s3.bucket,
                "prefix": l2.s3.prefix,
                "endpoint_url": l2.s3.endpoint,
                "region": l2.s3.region,
                "addressing_style": style,
            }
        )
    return L2Config(fs=fs, s3=s3)


IDLE_TIMEOUT_SECONDS = 0.0
"""Never close idle connections: the connector this tier hands to vLLM (LMCache's RESP backend) opens one
connection per worker thread when it starts and never reconnects. Read in LMCache's source
(csrc/storage_backends/connector_base.h: `worker_loop_for_queue` calls `create_connection()` once, before its
loop; redis/connector.cpp: a closed socket throws "socket recv failed: connection closed" on every later
request), so after the server's default 300 s idle close that worker would fail every request until vLLM
restarts. Idle slots stay bounded by AUTH (on by default) and `max_clients`."""


def _events_config(spec: KVCacheTierSpec) -> EventsConfig:
    """Off unless asked; bound on every interface of the pod (its loopback and its pod IP: the Service's target
    and the address in status.endpoints[].events). The config file cannot name the pod IP the way `--bind` does."""
    if not spec.events.enabled:
        return EventsConfig()
    medium = spec.events.single_medium
    return EventsConfig(
        publish=f"tcp://*:{spec.events.port}", medium=EventMedia(l1=medium, l2=medium) if medium else EventMedia()
    )


def _listen_config(spec: KVCacheTierSpec) -> ListenConfig:
    """TCP on the spec's port (bound to the pod IP by the DaemonSet's args), the node socket when asked, and the
    spec's sender threads."""
    if not spec.node_socket.enabled:
        return ListenConfig(port=spec.port, sender_threads=spec.sender_threads)
    return ListenConfig(
        port=spec.port,
        sender_threads=spec.sender_threads,
        unix_socket=NODE_SOCKET_PATH,
        unix_socket_mode=NODE_SOCKET_MODE,
        shared_memory=spec.node_socket.shared_memory,
        shared_memory_budget=spec.node_socket.shared_memory_budget,
        shared_memory_client_budget=spec.node_socket.shared_memory_client_budget,
    )


def build_server_config(spec: KVCacheTierSpec, tier: TierRef) -> KVServerConfig:
    """The complete server configuration; credentials stay out (they come from mounted Secrets)."""
    return KVServerConfig(
        listen=_listen_config(spec),
        l1=L1Config(
            size=spec.l1.size,
            eviction_policy=EvictionPolicyName(spec.l1.eviction_policy.value),
        ),
        l2=_l2_config(spec.l2),
        chunk_tokens=spec.chunk_tokens,
        # The configured namespace (`default_<digest>`) holds LMCache's and other RESP keys only: the vLLM
        # connector's keys name their own `<model>_<digest12>_r<rank>` (vLLM's FileMapper), and the server files
        # them there, where a vLLM `fs` tier on the same directory looks (strata_kv.store.blockfile.locate).
        namespace=NamespaceConfig(hash_algorithm=spec.hash.algorithm.value, hash_seed=hash_seed(spec, tier)),
        tenancy=TenancyConfig(require_salt=spec.tenancy.require_salt),
        auth=AuthConfig(token_file=f"{AUTH_DIR}/{AUTH_FILE}" if token_secret(spec, tier) else None),
        metrics=MetricsConfig(port=spec.metrics_port),
        limits=LimitsConfig(idle_timeout_seconds=IDLE_TIMEOUT_SECONDS),
        events=_events_config(spec),
        log_level=spec.log_level.value,
    )


def build_config_map(spec: KVCacheTierSpec, tier: TierRef) -> dict[str, Any]:
    """The ConfigMap mounted at /etc/strata-kv; its content hash rolls the DaemonSet's pods."""
    data = {CONFIG_FILE_NAME: build_server_config(spec, tier).to_yaml()}
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": tier.metadata(tier.config_map),
        "data": data,
    }


def config_hash(config_map: dict[str, Any]) -> str:
    return stable_hash(config_map["data"], length=16)
