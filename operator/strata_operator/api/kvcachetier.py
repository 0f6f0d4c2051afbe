"""KVCacheTier: a KV cache server on every matching GPU node, and how vLLM reaches it.

The spec models, their defaults and the CEL rules the API server enforces live here together; the
operator's own checks that need the cluster (node memory, Secrets, PVC access modes) live in
`strata_operator.resources.kvcachetier.validation`.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

from pydantic import ConfigDict, Field, model_validator

from strata_operator.api.base import (
    HOST_PATH_RULES,
    Condition,
    CRDModel,
    HostDirectory,
    PullPolicy,
    SecretKeyRef,
    allow_link_local_field,
    cel,
    endpoint_problem,
    endpoint_rules,
)
from strata_operator.api.crdgen import CRDSpec, PrinterColumn

QUANTITY_PATTERN = r"^([0-9]+)(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
"""A non-negative Kubernetes quantity (bytes); the units are the API server's own."""

_OBJECT_DEFAULT: dict[str, Any] = {"default": {}}
"""Lets the API server fill nested defaults when the parent object is omitted."""


def _validations(*rules: dict[str, str]) -> dict[str, Any]:
    """A `json_schema_extra` carrying CEL rules (typed loosely: pydantic wants JSON values)."""
    return {"x-kubernetes-validations": list(rules)}


def _rules(*rules: dict[str, str]) -> ConfigDict:
    """Model-level CEL rules (pydantic merges this with CRDModel's config)."""
    return ConfigDict(json_schema_extra=_validations(*rules))


class EvictionPolicy(StrEnum):
    """L1 eviction; `prefix-lirs` keeps hits on loops slightly larger than the cache, LRU does not."""

    PREFIX_LIRS = "prefix-lirs"
    LRU = "lru"


class HashAlgorithm(StrEnum):
    """vLLM's `--prefix-caching-hash-algo` choices; every engine sharing a tier must use the same one."""

    SHA256 = "sha256"
    SHA256_CBOR = "sha256_cbor"
    XXHASH = "xxhash"
    XXHASH_CBOR = "xxhash_cbor"


class S3AddressingStyle(StrEnum):
    AUTO = "auto"
    PATH = "path"
    VIRTUAL = "virtual"


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

    size: str = Field(
        default="4Gi",
        pattern=QUANTITY_PATTERN,
        description="Bytes of chunk values held in DRAM per node (a quantity: 4Gi, 512Mi).",
        json_schema_extra=_validations(
            cel("quantity(self).isGreaterThan(quantity('0'))", "l1.size must be greater than 0")
        ),
    )
    eviction_policy: EvictionPolicy = Field(
        default=EvictionPolicy.PREFIX_LIRS,
        description="prefix-lirs (scan-resistant, evicts chain tails first) or lru.",
    )


class PVCCreate(CRDModel):
    size: str = Field(pattern=QUANTITY_PATTERN, description="Requested storage of the created claim.")
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
    capacity: str = Field(
        default="0",
        pattern=QUANTITY_PATTERN,
        description="Bytes the tier may use; 0 means the filesystem's free space.",
    )
    high_watermark_percent: int = Field(default=90, ge=1, le=100, description="Start evicting above this.")
    low_watermark_percent: int = Field(default=80, ge=1, le=100, description="Evict down to this.")


class L2S3(CRDModel):
    model_config = _rules(
        cel(
            "!has(self.endpoint) || has(self.secretRef)",
            "l2.s3.endpoint needs l2.s3.secretRef: an S3-compatible endpoint has no pod identity",
            field_path=".secretRef",
        ),
        *endpoint_rules("l2.s3", "the KV server"),
    )

    bucket: str = Field(min_length=3, max_length=63)
    prefix: str = Field(default="", description="Key prefix inside the bucket.")
    endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://.+",
        max_length=2048,
        description="S3-compatible endpoint; AWS when omitted. Link-local and cloud metadata addresses are "
        "refused unless allowLinkLocal is set; IPv4 addresses must be written dotted-decimal.",
    )
    region: str | None = None
    addressing_style: S3AddressingStyle | None = Field(
        default=None, description="Bucket addressing; `path` when an endpoint is set, else `auto`."
    )
    secret_ref: SecretKeyRef | None = Field(
        default=None,
        description="Secret with AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; pod identity when omitted.",
    )
    allow_link_local: bool = allow_link_local_field()

    @model_validator(mode="after")
    def _endpoint_is_no_metadata_service(self) -> L2S3:
        if problem := endpoint_problem(self.endpoint, self.allow_link_local, "l2.s3", "the KV server"):
            raise ValueError(problem)
        return self


class L2Spec(CRDModel):
    model_config = _rules(cel("has(self.fs) || has(self.s3)", "l2 needs fs, s3 or both"))

    fs: L2FS | None = None
    s3: L2S3 | None = None


class HashSpec(CRDModel):
    """Settings every engine and server must share, or prefixes silently never match."""

    algorithm: HashAlgorithm = Field(default=HashAlgorithm.SHA256_CBOR)
    seed: str | None = Field(
        default=None,
        pattern=r"^[0-9]{1,10}$",
        description="PYTHONHASHSEED for every engine; derived from namespace/name when omitted.",
        json_schema_extra=_validations(cel("int(self) <= 4294967295", "hash.seed must be at most 4294967295")),
    )


class TenancySpec(CRDModel):
    require_salt: bool = Field(default=False, description="Reject keys that carry no tenant cache salt.")
    cache_salt: str | None = Field(
        default=None,
        max_length=256,
        description="Salt handed to this tier's clients in the connection ConfigMap.",
    )


class AuthSpec(CRDModel):
    secret_ref: SecretKeyRef = Field(description="Secret key holding the RESP AUTH token (key `token` if unset).")


class UpdateStrategy(CRDModel):
    type: UpdateStrategyType = UpdateStrategyType.ROLLING_UPDATE
    max_unavailable: int | str | None = Field(
        default=None, description="RollingUpdate: pods down at once (number or percent); 1 when omitted."
    )


class KVCacheTierSpec(CRDModel):
    """What runs on which nodes, with which tiers, and the settings its clients must share."""

    model_config = _rules(
        cel("self.port != self.metricsPort", "port and metricsPort must differ", field_path=".metricsPort")
    )

    image: str | None = Field(
        default=None,
        min_length=1,
        description="The runtime image; defaults to the operator's configured runtime image (STRATA_RUNTIME_IMAGE).",
    )
    image_pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list, description="core/v1 Tolerations.")
    affinity: dict[str, Any] | None = Field(default=None, description="A core/v1 Affinity.")
    priority_class_name: str | None = None
    resources: dict[str, Any] | None = Field(
        default=None, description="core/v1 ResourceRequirements; memory defaults to l1.size + memoryHeadroom."
    )
    memory_headroom: str = Field(
        default="1Gi", pattern=QUANTITY_PATTERN, description="Memory beyond L1 (process, write-behind queue)."
    )
    update_strategy: UpdateStrategy = Field(default_factory=UpdateStrategy, json_schema_extra=_OBJECT_DEFAULT)
    l1: L1Spec = Field(default_factory=L1Spec, json_schema_extra=_OBJECT_DEFAULT)
    l2: L2Spec | None = None
    chunk_tokens: int = Field(default=256, ge=1, le=65536, description="Tokens per chunk; engines must agree.")
    hash: HashSpec = Field(default_factory=HashSpec, json_schema_extra=_OBJECT_DEFAULT)
    tenancy: TenancySpec = Field(default_factory=TenancySpec, json_schema_extra=_OBJECT_DEFAULT)
    auth: AuthSpec | None = None
    port: int = Field(default=6379, ge=1, le=65535, description="RESP port of the servers and the Service.")
    metrics_port: int = Field(default=9121, ge=1, le=65535, description="Prometheus metrics and probes.")
    log_level: LogLevel = LogLevel.INFO
    client_shm_size: str | None = Field(
        default=None,
        pattern=QUANTITY_PATTERN,
        description="A memory-backed /dev/shm of this size limit for the serving pods the admission webhook "
        "wires to this tier (vLLM's CPU KV tier needs more than the runtime's 64Mi default); a pod's "
        "strata.dev/shm-size annotation overrides it.",
    )


class NodeEndpoint(CRDModel):
    node: str
    pod: str
    address: str | None = Field(default=None, description="host:port of the server's RESP listener.")
    ready: bool = False


class TierUsage(CRDModel):
    tier: str = Field(description="l1, fs or s3.")
    used_bytes: int = 0
    capacity_bytes: int = 0
    hits: int = 0
    hit_ratio: str = Field(default="0.000", description="This tier's share of all lookups.")


class Usage(CRDModel):
    """Summed from the servers' metrics by the periodic scrape."""

    scraped_instances: int = 0
    unreachable_instances: int = 0
    lookups: int = 0
    misses: int = 0
    hit_ratio: str = Field(default="0.000", description="Lookups answered from any tier.")
    tiers: list[TierUsage] = Field(default_factory=list)


class KVCacheTierStatus(CRDModel):
    observed_generation: int | None = None
    desired_instances: int | None = None
    ready_instances: int | None = None
    updated_instances: int | None = None
    l2: str | None = Field(default=None, description="The L2 kinds in use, e.g. `fs,s3` (for printing).")
    config_hash: str | None = None
    connection_config_map: str | None = Field(default=None, description="ConfigMap vLLM pods take envFrom.")
    service: str | None = None
    endpoints: list[NodeEndpoint] = Field(default_factory=list)
    usage: Usage | None = None
    conditions: list[Condition] = Field(default_factory=list)
    consumers: int | None = Field(
        default=None,
        description="Running or pending pods labelled strata.dev/kv-cache-tier with this tier's name.",
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
    ),
    description="A per-node KV cache tier server (DRAM L1, filesystem/S3 L2) for vLLM.",
)
