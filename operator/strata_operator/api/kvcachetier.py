"""KVCacheTier: a KV cache server on every matching GPU node, and how vLLM reaches it.

The spec models, their defaults and the CEL rules the API server enforces live here together; the
operator's own checks that need the cluster (node memory, Secrets, PVC access modes) live in
`strata_operator.resources.kvcachetier.validation`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Field, model_validator
from strata_kv.config import EvictionPolicyName, ListenConfig, S3AddressingStyle, SenderThreads
from strata_kv.csi.volume import DRIVER_NAME
from strata_units import ByteSize

from strata_operator.api.base import (
    BYTE_SIZE_UNITS,
    HOST_PATH_RULES,
    Condition,
    CRDModel,
    HostDirectory,
    PullPolicy,
    S3Endpoint,
    SecretKeyRef,
    WholeBytes,
    cel,
    endpoint_rules,
)
from strata_operator.api.crdgen import CRDSpec, PrinterColumn
from strata_operator.api.offload import OffloadStatus, OffloadVerdictSpec

_OBJECT_DEFAULT: dict[str, Any] = {"default": {}}
"""Lets the API server fill nested defaults when the parent object is omitted."""


def _validations(*rules: dict[str, str]) -> dict[str, Any]:
    """A `json_schema_extra` carrying CEL rules (typed loosely: pydantic wants JSON values)."""
    return {"x-kubernetes-validations": list(rules)}


def _rules(*rules: dict[str, str]) -> ConfigDict:
    """Model-level CEL rules (pydantic merges this with CRDModel's config)."""
    return ConfigDict(json_schema_extra=_validations(*rules))


EvictionPolicy = EvictionPolicyName
"""L1 eviction: the server's own list of policies (`prefix-lirs` keeps hits on loops slightly larger than the
cache, LRU does not)."""


class HashAlgorithm(StrEnum):
    """vLLM's `--prefix-caching-hash-algo` choices; every engine sharing a tier must use the same one."""

    SHA256 = "sha256"
    SHA256_CBOR = "sha256_cbor"
    XXHASH = "xxhash"
    XXHASH_CBOR = "xxhash_cbor"


class ConnectorType(StrEnum):
    """How vLLM reaches the tier: its own OffloadingConnector with Strata's tier (default), or LMCache's."""

    VLLM = "vllm"
    LMCACHE = "lmcache"


class EngineDevice(StrEnum):
    """Where the vLLM engines that use the tier compute: their offloading spec differs (vLLM's own refuses CPU)."""

    GPU = "gpu"
    CPU = "cpu"


class UpdateStrategyType(StrEnum):
    ROLLING_UPDATE = "RollingUpdate"
    ON_DELETE = "OnDelete"


class LogLevel(StrEnum):
    DEBUG = "DEBUG"
    INFO = "INFO"
    WARNING = "WARNING"
    ERROR = "ERROR"


class L1Spec(CRDModel):
    """The DRAM tier of each server: also what the pod's memory request is derived from."""

    size: Annotated[ByteSize, WholeBytes("l1.size", text=True)] = Field(
        default=ByteSize("4Gi"),
        description="Bytes of chunk values each server holds in DRAM: " + BYTE_SIZE_UNITS + ". Default 4Gi. The "
        "pod's memory request is this plus memoryHeadroom.",
    )
    eviction_policy: EvictionPolicy = Field(
        default=EvictionPolicy.PREFIX_LIRS,
        description="prefix-lirs (scan-resistant, evicts chain tails first) or lru.",
    )


class PVCCreate(CRDModel):
    size: Annotated[ByteSize, WholeBytes("l2.fs.pvc.create.size", text=True)] = Field(
        description="Storage request of the created claim, in bytes: " + BYTE_SIZE_UNITS + " (e.g. 500Gi)."
    )
    storage_class_name: str | None = Field(
        default=None, description="A class that provisions ReadWriteMany volumes (NFS, CephFS, Lustre ...)."
    )


class L2PVC(CRDModel):
    """A ReadWriteMany claim every node mounts: existing (`claimName`) or created by the operator."""

    model_config = _rules(
        cel(
            "has(self.claimName) != has(self.create)",
            "l2.fs.pvc needs exactly one of claimName (existing claim) or create",
        )
    )

    claim_name: str | None = Field(
        default=None, max_length=253, description="An existing ReadWriteMany claim in this namespace."
    )
    create: PVCCreate | None = Field(default=None, description="Create `<name>-l2` with this size.")


class HostPath(CRDModel):
    """Node-local NVMe: each node keeps its own L2 (needs a namespace that admits hostPath volumes)."""

    path: HostDirectory = Field(
        description="An existing directory on the node, writable by UID 65532; the server writes and evicts "
        "chunk files in it." + HOST_PATH_RULES
    )


class L2FS(CRDModel):
    """A filesystem tier in vLLM's offloading FS layout, with the capacity limit vLLM lacks."""

    model_config = _rules(
        cel("has(self.pvc) != has(self.hostPath)", "l2.fs needs exactly one of pvc or hostPath"),
        cel(
            "self.lowWatermarkPercent < self.highWatermarkPercent",
            "l2.fs.lowWatermarkPercent must be below highWatermarkPercent",
        ),
    )

    pvc: L2PVC | None = None
    host_path: HostPath | None = None
    capacity: Annotated[ByteSize, WholeBytes("l2.fs.capacity", minimum=0, text=True)] = Field(
        default=ByteSize("0"),
        description="Bytes the tier may use: " + BYTE_SIZE_UNITS + ". Default 0, which means the filesystem's "
        "free space.",
    )
    high_watermark_percent: int = Field(default=90, ge=1, le=100, description="Start evicting above this.")
    low_watermark_percent: int = Field(default=80, ge=1, le=100, description="Evict down to this.")


class L2S3(S3Endpoint):
    """An S3 bucket (or S3-compatible store) shared by every node: the tier behind DRAM and the filesystem."""

    FIELD, WHO = "l2.s3", "the KV server"
    model_config = _rules(
        cel(
            "!has(self.endpoint) || has(self.secretRef)",
            "l2.s3.endpoint needs l2.s3.secretRef: an S3-compatible endpoint has no pod identity",
            field_path=".secretRef",
        ),
        *endpoint_rules(FIELD, WHO),
    )

    bucket: str = Field(min_length=3, max_length=63, description="Bucket name, e.g. kv-cache (3 to 63 characters).")
    prefix: str = Field(default="", description="Key prefix inside the bucket.")
    addressing_style: S3AddressingStyle | None = Field(
        default=None, description="Bucket addressing; `path` when an endpoint is set, else `auto`."
    )
    secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; pod identity when omitted.",
    )


class L2Spec(CRDModel):
    """Tiers below DRAM: a filesystem, an S3 bucket, or both (filesystem first)."""

    model_config = _rules(cel("has(self.fs) || has(self.s3)", "l2 needs fs, s3 or both"))

    fs: L2FS | None = Field(
        default=None, description="A filesystem tier: a shared ReadWriteMany claim or a node-local hostPath."
    )
    s3: L2S3 | None = Field(default=None, description="An S3 tier shared by every node.")


class HashSpec(CRDModel):
    """Settings every engine and server must share, or prefixes silently never match."""

    algorithm: HashAlgorithm = Field(
        default=HashAlgorithm.SHA256_CBOR,
        description="vLLM's --prefix-caching-hash-algo for every engine: sha256, sha256_cbor (default), xxhash or "
        "xxhash_cbor.",
    )
    seed: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,10}$",
        description="PYTHONHASHSEED for every engine; derived from namespace/name when omitted.",
        json_schema_extra=_validations(cel("int(self) <= 4294967295", "hash.seed must be at most 4294967295")),
    )


class TenancySpec(CRDModel):
    """Keeping tenants' cached prefixes apart on one tier."""

    require_salt: bool = Field(default=False, description="Reject keys that carry no tenant cache salt.")
    cache_salt: str | None = Field(
        default=None,
        max_length=256,
        description="Salt handed to this tier's clients in the connection ConfigMap.",
    )


class AuthSpec(CRDModel):
    """RESP AUTH for the servers: on by default, since every pod on a node can reach the node-local Service."""

    model_config = _rules(
        cel(
            "!(has(self.disabled) && self.disabled && has(self.secretRef))",
            "auth.disabled and auth.secretRef exclude each other: remove one",
        )
    )

    secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret key holding the RESP AUTH token (key `token` if unset). When omitted the operator "
        "creates `<name>-kv-token` with a random token, owned by the tier and never rewritten.",
    )
    disabled: bool = Field(
        default=False,
        description="Run the servers without AUTH: any pod that reaches a node's Service can read and write "
        "every cached chunk.",
    )


class ConnectorSpec(CRDModel):
    """What the `<name>-connection` ConfigMap tells vLLM to load, and the settings of vLLM's own CPU tier."""

    type: ConnectorType = Field(
        default=ConnectorType.VLLM,
        description="vllm (default): vLLM's OffloadingConnector with TieringOffloadingSpec and Strata's tier "
        "(strata_kv.vllm_tier, `pip install strata` in the serving image), a CPU tier per engine in /dev/shm in "
        "front of the node's server. lmcache: LMCache's connector on its RESP backend (needs lmcache in the "
        "image; vLLM turns its hybrid KV cache manager off with it).",
    )
    cpu_bytes: Annotated[ByteSize, WholeBytes("connector.cpuBytes", text=True)] = Field(
        default=ByteSize("4Gi"),
        description="vllm: bytes of each engine's CPU tier (cpu_bytes_to_use), allocated in /dev/shm: "
        + BYTE_SIZE_UNITS
        + ". Default 4Gi. The webhook's /dev/shm is this plus 1Gi unless clientShmSize says otherwise. It stages "
        "every transfer to and from the server, so it must hold what is in flight: too small, and "
        "status.offload.engineStoreRefusals counts the stores it had no room for.",
    )
    offload_prompt_only: bool = Field(
        default=True,
        description="vllm: offload only the prompt's KV (vLLM's default), not what decoding generates.",
    )
    engine: EngineDevice = Field(
        default=EngineDevice.GPU,
        description="vllm: where the engines compute. gpu (default): vLLM's TieringOffloadingSpec. cpu: vLLM's CPU "
        "backend, whose own offloading refuses the CPU platform: Strata's StrataCPUOffloadingSpec "
        "(strata_kv.vllm_cpu_offload; vLLM 0.32 and 0.33). KV_TRANSFER_CONFIG follows this; the connection "
        "ConfigMap also carries KV_TRANSFER_CONFIG_GPU and KV_TRANSFER_CONFIG_CPU, and a pod annotated "
        "strata.dev/kv-engine gets the one it names.",
    )


class EventsSpec(CRDModel):
    """KV events: each server publishes vLLM's own KV event stream (ZMQ PUB, msgpack `KVEventBatch`) for the
    vLLM-tier blocks it holds, so a prefix-aware router (llm-d's indexer) sees which node's tier has a block."""

    enabled: bool = Field(
        default=False,
        description="Publish BlockStored / BlockRemoved for what each server holds, per tier: medium CPU for its "
        "DRAM (L1), STORAGE for its L2, so a router's per-medium index follows each tier. Off by default.",
    )
    port: int = Field(
        default=5557,
        ge=1,
        le=65535,
        description="ZMQ PUB port of each server, in the pod and on the node-local Service (vLLM's default 5557).",
    )
    single_medium: Literal["CPU", "STORAGE"] | None = Field(
        default=None,
        description="Name every tier with this one medium instead (the view before per-tier media: a block moving "
        "between DRAM and L2 is no event, and is removed once no tier holds it).",
    )


class NodeSocketSpec(CRDModel):
    """A Unix socket each server shares with the serving pods on its node, through an ephemeral inline CSI
    volume (the chart's `kvSocketDriver`), so that restricted pods reach the node-local fast path without
    hostPath or hostIPC."""

    enabled: bool = Field(
        default=False,
        description="Serve on a Unix socket in a node directory the CSI driver publishes into the servers and, "
        "through the admission webhook, into the serving pods wired to this tier. Needs the chart's "
        "kvSocketDriver.enabled. Off by default.",
    )
    shared_memory: bool = Field(
        default=False,
        description="Over that socket, hand values of 1 MiB or more to clients as sealed, read-only memory "
        "(memfd) instead of copying them through the socket. A client that keeps a value mapped holds its "
        "memory past the L1 bound until it lets go (within sharedMemoryBudget), so it is off by default.",
    )
    shared_memory_budget: Annotated[ByteSize, WholeBytes("nodeSocket.sharedMemoryBudget", text=True)] = Field(
        default=ByteSize("256Mi"),
        description="With sharedMemory: bytes of handed-over values that clients may still hold, all clients of "
        "one server together (charged to the server's memory, and added to its derived memory request); past it "
        "a GET is answered with the bytes instead. Default 256Mi.",
    )
    shared_memory_client_budget: Annotated[ByteSize, WholeBytes("nodeSocket.sharedMemoryClientBudget", text=True)] = (
        Field(
            default=ByteSize("64Mi"),
            description="Of sharedMemoryBudget, what one client connection may hold; past it that connection's GETs "
            "are answered with the bytes. Default 64Mi, at most sharedMemoryBudget.",
        )
    )
    driver: str = Field(
        default=DRIVER_NAME,
        min_length=1,
        max_length=63,
        pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$",
        description="The CSI driver that publishes the socket directory (the chart's kvSocketDriver.name).",
    )


EVENTS_PORT_CLASH = "events.port must differ from port and metricsPort"
SHARED_MEMORY_NEEDS_SOCKET = "nodeSocket.sharedMemory hands memory over the node socket: set nodeSocket.enabled"
SHARED_MEMORY_CLIENT_BUDGET = "nodeSocket.sharedMemoryClientBudget must not exceed nodeSocket.sharedMemoryBudget"


class UpdateStrategy(CRDModel):
    """How the DaemonSet replaces servers when the spec changes (its updateStrategy)."""

    type: UpdateStrategyType = Field(
        default=UpdateStrategyType.ROLLING_UPDATE,
        description="RollingUpdate (default: replace servers a few at a time) or OnDelete (only when a pod is "
        "deleted).",
    )
    max_unavailable: int | str | None = Field(
        default=None, description="RollingUpdate: pods down at once (number or percent); 1 when omitted."
    )


SALT_NEEDS_LMCACHE = (
    "tenancy.requireSalt checks LMCache's keys (model@...@salt); with connector vllm a tenant's cache_salt is part "
    "of vLLM's block hashes instead, so the servers would refuse every chunk: set connector.type lmcache, or "
    "requireSalt false"
)


class NamespaceCollectionSpec(CRDModel):
    """Garbage collection of KV computed with weights no pod serves any more (docs/serving.md: KV follows the
    model revision)."""

    enabled: bool = Field(
        default=True,
        description="Drop, from L1 and L2 on every server, the KV namespaces of a ModelCache revision that is no "
        "longer the cache's and that no wired pod has served for gracePeriodSeconds.",
    )
    grace_period_seconds: int = Field(
        default=3600,
        ge=0,
        le=30 * 24 * 3600,
        description="How long an old revision's namespaces stay after its last wired pod went (default 3600; "
        "at most 30 days): a rollback within it finds its KV still there.",
    )


class KVCacheTierSpec(CRDModel):
    """What runs on which nodes, with which tiers, and the settings its clients must share."""

    model_config = _rules(
        cel("self.port != self.metricsPort", "port and metricsPort must differ", field_path=".metricsPort"),
        cel(
            "!self.events.enabled || (self.events.port != self.port && self.events.port != self.metricsPort)",
            EVENTS_PORT_CLASH,
            field_path=".events.port",
        ),
        cel(
            "!has(self.nodeSocket) || !has(self.nodeSocket.sharedMemory) || !self.nodeSocket.sharedMemory || "
            "(has(self.nodeSocket.enabled) && self.nodeSocket.enabled)",
            SHARED_MEMORY_NEEDS_SOCKET,
            field_path=".nodeSocket.sharedMemory",
        ),
        cel(
            "!(has(self.tenancy) && has(self.tenancy.requireSalt) && self.tenancy.requireSalt && "
            "(!has(self.connector) || !has(self.connector.type) || self.connector.type == 'vllm'))",
            SALT_NEEDS_LMCACHE,
            field_path=".tenancy.requireSalt",
        ),
    )

    image: str | None = Field(
        default=None,
        min_length=1,
        description="The runtime image; defaults to the operator's configured runtime image (STRATA_RUNTIME_IMAGE).",
    )
    image_pull_policy: PullPolicy | None = Field(
        default=None,
        description="Pull policy of the servers' image; with no image set, the operator's configured policy "
        "(STRATA_RUNTIME_IMAGE_PULL_POLICY), else Kubernetes' default.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description='Labels selecting the nodes that run a server, e.g. {nvidia.com/gpu.present: "true"}; every '
        "node when empty.",
    )
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="core/v1 Tolerations.")
    affinity: dict[str, Any] | None = Field(default=None, description="A core/v1 Affinity.")
    priority_class_name: str | None = Field(
        default=None, description="PriorityClass of the server pods, e.g. system-node-critical; none when omitted."
    )
    resources: dict[str, Any] | None = Field(
        default=None, description="core/v1 ResourceRequirements; memory defaults to l1.size + memoryHeadroom."
    )
    memory_headroom: Annotated[ByteSize, WholeBytes("memoryHeadroom", minimum=0, text=True)] = Field(
        default=ByteSize("1Gi"),
        description="Memory each server needs beyond l1.size (the process, the write-behind queue), in bytes: "
        + BYTE_SIZE_UNITS
        + ". Default 1Gi; added to l1.size for the pod's memory request.",
    )
    update_strategy: UpdateStrategy = Field(
        default_factory=UpdateStrategy,
        json_schema_extra=_OBJECT_DEFAULT,
        description="How servers are replaced on a change. Default RollingUpdate, one node at a time.",
    )
    l1: L1Spec = Field(
        default_factory=L1Spec, json_schema_extra=_OBJECT_DEFAULT, description="The DRAM tier of each server."
    )
    l2: L2Spec | None = Field(
        default=None, description="Tiers below DRAM (filesystem and/or S3); DRAM only when omitted."
    )
    chunk_tokens: int = Field(default=256, ge=1, le=65536, description="Tokens per chunk; engines must agree.")
    hash: HashSpec = Field(
        default_factory=HashSpec,
        json_schema_extra=_OBJECT_DEFAULT,
        description="The prefix hash every engine and server must share.",
    )
    tenancy: TenancySpec = Field(
        default_factory=TenancySpec,
        json_schema_extra=_OBJECT_DEFAULT,
        description="Tenant separation: a cache salt for this tier's clients, and whether the server requires one.",
    )
    auth: AuthSpec = Field(
        default_factory=AuthSpec,
        json_schema_extra=_OBJECT_DEFAULT,
        description="RESP AUTH: on by default with a token the operator generates; a Secret of your own with "
        "secretRef, or none with disabled: true.",
    )
    connector: ConnectorSpec = Field(
        default_factory=ConnectorSpec,
        json_schema_extra=_OBJECT_DEFAULT,
        description="The vLLM connector the connection ConfigMap renders: vllm (default) or lmcache.",
    )
    events: EventsSpec = Field(
        default_factory=EventsSpec,
        json_schema_extra=_OBJECT_DEFAULT,
        description="KV events in vLLM's wire format for what the servers hold (for prefix-aware routers); off "
        "by default.",
    )
    node_socket: NodeSocketSpec = Field(
        default_factory=NodeSocketSpec,
        json_schema_extra=_OBJECT_DEFAULT,
        description="A node-local Unix socket (and shared memory) for serving pods on the same node; off by default.",
    )
    offload_verdict: OffloadVerdictSpec = Field(
        default_factory=OffloadVerdictSpec,
        json_schema_extra=_OBJECT_DEFAULT,
        description="How status.offload judges whether offloading pays (recompute time per token, the window).",
    )
    namespace_collection: NamespaceCollectionSpec = Field(
        default_factory=NamespaceCollectionSpec,
        json_schema_extra=_OBJECT_DEFAULT,
        description="Garbage collection of the KV namespaces of ModelCache revisions no pod serves; on by default "
        "with a one-hour grace period.",
    )
    port: int = Field(default=6379, ge=1, le=65535, description="RESP port of the servers and the Service.")
    metrics_port: int = Field(default=9121, ge=1, le=65535, description="Prometheus metrics and probes.")
    log_level: LogLevel = Field(
        default=LogLevel.INFO, description="Server log level: DEBUG, INFO (default), WARNING or ERROR."
    )
    sender_threads: SenderThreads = Field(
        default=ListenConfig.model_fields["sender_threads"].default,
        description=f"{ListenConfig.model_fields['sender_threads'].description} Per server; with threads, the CPU "
        "request defaults to threads + 1.",
    )
    client_shm_size: Annotated[ByteSize, WholeBytes("clientShmSize", text=True)] | None = Field(
        default=None,
        description="A memory-backed /dev/shm of this size limit for the serving pods the admission webhook "
        "wires to this tier (vLLM's CPU KV tier needs more than the runtime's 64Mi default); a pod's "
        "strata.dev/shm-size annotation overrides it. Default with connector vllm: connector.cpuBytes + 1Gi; "
        "with lmcache: none.",
    )

    @model_validator(mode="after")
    def _salt_needs_lmcache(self) -> KVCacheTierSpec:
        if self.tenancy.require_salt and self.connector.type == ConnectorType.VLLM:
            raise ValueError(SALT_NEEDS_LMCACHE)
        if self.events.enabled and self.events.port in (self.port, self.metrics_port):
            raise ValueError(EVENTS_PORT_CLASH)
        if self.node_socket.shared_memory and not self.node_socket.enabled:
            raise ValueError(SHARED_MEMORY_NEEDS_SOCKET)
        if self.node_socket.shared_memory_client_budget > self.node_socket.shared_memory_budget:
            raise ValueError(SHARED_MEMORY_CLIENT_BUDGET)
        return self


class NodeEndpoint(CRDModel):
    """One server: where it runs and where clients reach it."""

    node: str = Field(description="The node the server runs on.")
    pod: str = Field(description="The server's pod.")
    address: str | None = Field(default=None, description="host:port of the server's RESP listener.")
    events: str | None = Field(
        default=None, description="tcp://host:port of the server's KV event publisher (with events.enabled)."
    )
    ready: bool = Field(default=False, description="Whether the pod is Ready (its probes pass).")
    node_not_ready: str | None = Field(
        default=None,
        description="Why the server's node is not Ready (its Ready condition), when it is not: its node-local "
        "clients cannot reach it until the node returns.",
    )


class TierUsage(CRDModel):
    """One tier's use, summed over the servers scraped."""

    tier: str = Field(description="l1, fs or s3.")
    used_bytes: int = Field(default=0, description="Bytes held in this tier.")
    capacity_bytes: int = Field(default=0, description="Bytes this tier may hold (0: no configured limit).")
    hits: int = Field(default=0, description="Lookups this tier answered.")
    hit_ratio: str = Field(default="0.000", description="This tier's share of all lookups.")


class Usage(CRDModel):
    """Summed from the servers' metrics by the periodic scrape."""

    scraped_instances: int = Field(default=0, description="Servers whose metrics were read in the last scrape.")
    unreachable_instances: int = Field(default=0, description="Servers whose metrics could not be read.")
    lookups: int = Field(default=0, description="Chunk lookups the servers have answered since they started.")
    misses: int = Field(default=0, description="Lookups no tier could answer.")
    hit_ratio: str = Field(default="0.000", description="Lookups answered from any tier.")
    tiers: list[TierUsage] = Field(default_factory=list, description="Use and hits per tier.")


class ServedNamespace(CRDModel):
    """A model revision wired pods serve (or served) through this tier: the namespaces it may collect."""

    model_cache: str = Field(description="The ModelCache the pods were wired to.")
    revision: str = Field(description="The cache's revision the pods were wired with (12 hex digits).")
    model: str = Field(
        description="The engine's model name (the mount path the webhook gave): the vLLM namespaces on the "
        "servers are `<model with / as _>_<digest12>`."
    )
    serving_pods: int = Field(default=0, description="Wired pods of this revision that exist now.")
    idle_since: str | None = Field(default=None, description="When the last such pod went (RFC 3339).")
    pending: str | None = Field(
        default=None, description="Why its collection is not finished (servers that did not answer); retried."
    )


class CollectedNamespace(CRDModel):
    """One namespace the tier dropped (the latest few are kept)."""

    namespace: str = Field(description="The vLLM namespace dropped from every server.")
    model_cache: str = Field(description="The ModelCache it belonged to.")
    revision: str = Field(description="The revision its KV was computed with.")
    blocks: int = Field(default=0, description="Blocks removed, over every server and tier.")
    freed_bytes: int = Field(default=0, description="Bytes freed, over every server and tier.")
    time: str | None = Field(default=None, description="When (RFC 3339).")


class KVCacheTierStatus(CRDModel):
    """What the operator observed: the servers, how clients reach them, and how the cache is used."""

    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status was computed from."
    )
    desired_instances: int | None = Field(default=None, description="Nodes that should run a server.")
    ready_instances: int | None = Field(default=None, description="Servers that are Ready.")
    updated_instances: int | None = Field(default=None, description="Servers running the current config.")
    l2: str | None = Field(default=None, description="The L2 kinds in use, e.g. `fs,s3` (for printing).")
    config_hash: str | None = Field(
        default=None, description="Hash of the server config now wanted; a change rolls every server."
    )
    connection_config_map: str | None = Field(default=None, description="ConfigMap vLLM pods take envFrom.")
    service: str | None = Field(default=None, description="The Service in front of the servers.")
    endpoints: list[NodeEndpoint] = Field(default_factory=list, description="One entry per server.")
    usage: Usage | None = Field(default=None, description="Use and hit ratios from the servers' metrics.")
    offload: OffloadStatus | None = Field(
        default=None, description="Whether offloading pays over the last window (the OffloadEffective condition)."
    )
    conditions: list[Condition] = Field(
        default_factory=list,
        description="ConfigValid, Available, AllInstancesReady, L2Reachable, Ready, Reconciling and Stalled.",
    )
    consumers: int | None = Field(
        default=None,
        description="Running or pending pods labelled strata.dev/kv-cache-tier with this tier's name.",
    )
    namespaces: list[ServedNamespace] = Field(
        default_factory=list,
        description="Model revisions wired pods serve through this tier, and old ones awaiting collection.",
    )
    collected_namespaces: list[CollectedNamespace] = Field(
        default_factory=list, description="The latest namespaces collected, newest last."
    )


CRD = CRDSpec(
    kind="KVCacheTier",
    plural="kvcachetiers",
    short_names=("kvt",),
    spec_model=KVCacheTierSpec,
    status_model=KVCacheTierStatus,
    printer_columns=(
        PrinterColumn("Ready", ".status.readyInstances", "integer"),
        PrinterColumn("Desired", ".status.desiredInstances", "integer"),
        PrinterColumn("L1", ".spec.l1.size"),
        PrinterColumn("L2", ".status.l2"),
        PrinterColumn("Available", '.status.conditions[?(@.type=="Available")].status', description="Serving"),
        PrinterColumn("Hit", ".status.offload.hitRatio", description="Hit ratio over the offload window"),
        PrinterColumn(
            "Offload",
            '.status.conditions[?(@.type=="OffloadEffective")].reason',
            description="Pays, DoesNotPay or InsufficientData",
        ),
    ),
    root_validations=(
        cel(
            "self.metadata.name.size() <= 63",
            "metadata.name must be at most 63 characters: the DaemonSet, the Service and label values carry it",
            reason="FieldValueInvalid",
        ),
        cel(
            "self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
            "metadata.name must be a DNS label starting with a letter (no dots): the Service is named after it",
            reason="FieldValueInvalid",
        ),
    ),
    description="A per-node KV cache tier server (DRAM L1, filesystem/S3 L2) for vLLM.",
)
