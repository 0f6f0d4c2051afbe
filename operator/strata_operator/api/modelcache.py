"""ModelCache: get a model's files somewhere pods can read them fast, once, and say where.

The spec and status models, their defaults and the CEL rules the API server enforces live here; the CRD in
`crds/modelcaches.strata.dev.yaml` is generated from them (`make crds`).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, model_validator
from strata_loader import contract
from strata_loader.contract import SOURCE_URI_GRAMMAR, VerifyMode
from strata_units import ByteSize

from strata_operator.api.base import (
    BYTE_SIZE_UNITS,
    DNS_SUBDOMAIN_PATTERN,
    HOST_PATH_RULES,
    Condition,
    CRDModel,
    HostDirectory,
    PullPolicy,
    S3Endpoint,
    SecretRef,
    WholeBytes,
    cel,
    endpoint_rules,
)
from strata_operator.api.crdgen import CRDSpec, PrinterColumn

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
SOURCE_URI_PATTERN = "^(" + "|".join([*SOURCE_URI_GRAMMAR.values(), "oci://.+"]) + ")$"
"""The preloader's own grammar of each source it reads (so the API cannot accept a URI the Job would refuse), and
oci:// for an image volume."""


class StorageMode(StrEnum):
    SHARED_PVC = "SharedPVC"
    NODE_LOCAL = "NodeLocal"
    IMAGE_VOLUME = "ImageVolume"


class DeletionPolicy(StrEnum):
    """What happens to the model's bytes when the ModelCache is deleted."""

    DELETE = "Delete"
    RETAIN = "Retain"


def _validations(*rules: dict[str, str]) -> dict[str, Any]:
    """`json_schema_extra` carrying CEL rules; crdgen copies them into the CRD as they are."""
    return {"x-kubernetes-validations": list(rules)}


OPTION_LIKE = "must not start with '-': the preloader's argument parser would read it as an option"


def _not_option_like(value: str) -> str:
    """The model's side of the `startsWith('-')` rules below."""
    if value.startswith("-"):
        raise ValueError(f"{value!r} {OPTION_LIKE}")
    return value


Glob = Annotated[
    str,
    Field(
        min_length=1,
        max_length=1024,
        json_schema_extra=_validations(
            cel(
                "!self.startsWith('-')",
                f"{OPTION_LIKE}; to match names starting with '-', begin the glob with [-] (e.g. '[-]*.bin')",
            )
        ),
    ),
    AfterValidator(_not_option_like),
]
"""One include/exclude glob on relative paths, passed to the preloader as an argument."""


class Credentials(CRDModel):
    """Credentials come only from a Secret in the same namespace or from the pod's service account."""

    secret_ref: SecretRef | None = Field(
        default=None,
        description="Secret whose keys become the preloader's environment (AWS_ACCESS_KEY_ID, "
        "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, ...; for hf:// HF_TOKEN, and HF_ENDPOINT to read a Hub mirror).",
    )
    service_account_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN_PATTERN,
        max_length=253,
        description="Service account the preloader runs as (IRSA, GKE/Azure workload identity).",
    )


class S3Options(S3Endpoint):
    """Settings for an s3:// source beyond the URI; only allowed with one."""

    FIELD, WHO = "source.s3", "the preloader"
    model_config = ConfigDict(json_schema_extra=_validations(*endpoint_rules(FIELD, WHO)))


class ModelSource(CRDModel):
    """Where the model's files come from, and which of them."""

    uri: str = Field(
        pattern=SOURCE_URI_PATTERN,
        max_length=2048,
        description="Where the model comes from: s3://bucket/prefix, hf://org/name, pvc://claim/path, "
        "oci://registry/repo:tag (ImageVolume only). Immutable.",
        json_schema_extra=_validations(
            cel("self == oldSelf", "source.uri is immutable; create a new ModelCache for another model")
        ),
    )
    revision: Annotated[str, AfterValidator(_not_option_like)] | None = Field(
        default=None,
        max_length=256,
        description="Hugging Face revision (branch, tag or commit; default main), resolved once to the commit that "
        "is copied and recorded in status.resolvedRevision; for S3 a label recorded in status. Must not start with "
        "'-'.",
        json_schema_extra=_validations(cel("!self.startsWith('-')", f"source.revision {OPTION_LIKE}")),
    )
    include: list[Glob] = Field(
        default_factory=list,
        max_length=64,
        description="Globs on relative paths to copy; empty means all. A glob must not start with '-'.",
    )
    exclude: list[Glob] = Field(
        default_factory=list,
        max_length=64,
        description="Globs on relative paths to skip. A glob must not start with '-'.",
    )
    credentials: Credentials | None = Field(
        default=None,
        description="How the preloader authenticates to the source; anonymous (or the node's identity) when omitted.",
    )
    s3: S3Options | None = Field(default=None, description="Endpoint, region and safety settings for an s3:// source.")


class SharedPVCStorage(CRDModel):
    """One ReadWriteMany claim filled once and mounted read-only by every serving pod."""

    claim_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN_PATTERN,
        max_length=253,
        description="An existing claim to fill (adopted, never deleted); when omitted the operator creates "
        "<name>-model.",
    )
    size: Annotated[ByteSize, WholeBytes("storage.sharedPVC.size", text=True)] | None = Field(
        default=None,
        description="Storage request of the claim the operator creates, in bytes: " + BYTE_SIZE_UNITS + " (e.g. "
        "200Gi). Not used with claimName.",
    )
    storage_class_name: str | None = Field(
        default=None,
        max_length=253,
        description="StorageClass of the claim the operator creates; the cluster's default class when omitted.",
    )
    access_mode: str = Field(
        default="ReadWriteMany",
        description="Access mode of the claim the operator creates. Default ReadWriteMany, so pods on every node "
        "can mount it; ReadWriteOnce only suits serving pods on one node.",
        json_schema_extra={"enum": ["ReadWriteMany", "ReadOnlyMany", "ReadWriteOnce", "ReadWriteOncePod"]},
    )


class FanOut(CRDModel):
    """Download once, fan out: the first node reads the source; the others read the files from nodes whose copy
    is Ready, through a per-cache peer server (a DaemonSet on those nodes behind a headless Service)."""

    enabled: bool = Field(
        default=True,
        description="Read the source once for all selected nodes (default true; it applies only with more than one "
        "node). false: every node's Job reads the source itself.",
    )
    peer_wait_seconds: int = Field(
        default=900,
        ge=0,
        le=86400,
        description="Seconds the other nodes wait for the first copy and a ready peer before their Jobs read the "
        "source themselves, 0 to 86400. Default 900.",
    )


class NodeLocalStorage(CRDModel):
    """A copy on each selected node's local disk, made by one preload Job per node."""

    path: HostDirectory = Field(
        default="/var/lib/strata/models",
        description="Directory on each node (NVMe) that must exist and be writable by UID 65532; the copy "
        "lands in <path>/<namespace>/<name>, which deletion removes." + HOST_PATH_RULES,
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description='Labels selecting the nodes that get a copy, e.g. {nvidia.com/gpu.present: "true"}; every '
        "node when empty.",
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list,
        description="core/v1 Tolerations for the per-node preload Jobs, so they run on tainted (GPU) nodes.",
    )
    pinned: bool = Field(
        default=False,
        description="Deprecated request, within the namespace only: keep this cache's copies from being evicted "
        "by the other caches of its own namespace. It does not protect against other namespaces (only a "
        "NodeCachePolicy's evictAcrossNamespaces lets them evict at all, and its pinned list decides what they "
        "may not), and a pinned copy still counts against the namespace's budget. Copies a live pod on the node "
        "uses are never evicted, pinned or not.",
    )
    fan_out: FanOut = Field(
        default_factory=FanOut,
        description="Download once, fan out: on by default; see fanOut.enabled.",
        json_schema_extra={"default": {}},
    )


class ConfigMapKeyRef(CRDModel):
    """One key of a ConfigMap in the resource's namespace (public data such as a CA bundle)."""

    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN, description="Name of the ConfigMap.")
    key: str = Field(default="ca.crt", min_length=1, max_length=253, description="The key (default ca.crt).")


class ImageVolumeStorage(CRDModel):
    """The model packaged as an OCI image (the oci:// source), mounted as an image volume."""

    pull_policy: PullPolicy = Field(
        default=PullPolicy.IF_NOT_PRESENT,
        description="Pull policy of the image volume: Always, IfNotPresent (default) or Never.",
    )
    pre_pull: bool = Field(default=False, description="Pull the image on every selected node ahead of use.")
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Labels selecting the nodes to pre-pull on; every node when empty."
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="core/v1 Tolerations for the pre-pull Jobs on tainted (GPU) nodes."
    )
    pull_secret_ref: SecretRef | None = Field(
        default=None,
        description="A Secret of type kubernetes.io/dockerconfigjson with the registry's credentials: the operator "
        "reads it to resolve the tag, and gives it as imagePullSecrets to the pre-pull Jobs and (through the "
        "webhook and status.volume) to serving pods. Anonymous when omitted.",
    )
    ca_config_map_ref: ConfigMapKeyRef | None = Field(
        default=None,
        description="A ConfigMap key holding the PEM CA bundle the operator trusts for the registry (default key "
        "ca.crt); the system's trust when omitted. Verification is never turned off. Nodes trust the registry "
        "through their container runtime's own configuration.",
    )


def _only_with_mode(field: str, mode: str) -> dict[str, str]:
    return cel(
        f"self.mode == '{mode}' || !has(self.{field})",
        f"storage.{field} is only allowed when storage.mode is {mode}",
        reason="FieldValueForbidden",
    )


class Storage(CRDModel):
    """Where the model's files are kept; exactly the settings of the chosen mode may be given."""

    mode: StorageMode = Field(
        description="SharedPVC, NodeLocal or ImageVolume. Immutable.",
        json_schema_extra=_validations(
            cel("self == oldSelf", "storage.mode is immutable; create a new ModelCache to change it")
        ),
    )
    shared_pvc: SharedPVCStorage | None = Field(
        default=None, alias="sharedPVC", description="Settings of mode SharedPVC; size or claimName is required."
    )
    node_local: NodeLocalStorage | None = Field(default=None, description="Settings of mode NodeLocal.")
    image_volume: ImageVolumeStorage | None = Field(default=None, description="Settings of mode ImageVolume.")

    model_config = ConfigDict(
        json_schema_extra=_validations(
            cel(
                "self.mode != 'SharedPVC' || (has(self.sharedPVC) && "
                "(has(self.sharedPVC.claimName) || has(self.sharedPVC.size)))",
                "storage.mode SharedPVC needs storage.sharedPVC.size (to create a claim) "
                "or storage.sharedPVC.claimName (to fill an existing one)",
                reason="FieldValueRequired",
            ),
            _only_with_mode("sharedPVC", "SharedPVC"),
            _only_with_mode("nodeLocal", "NodeLocal"),
            _only_with_mode("imageVolume", "ImageVolume"),
        )
    )


class ShardSpec(CRDModel):
    """Pre-shard the model for tensor parallelism after the copy (model-rank-<r>-part-<p>.safetensors files)."""

    tensor_parallel_size: int = Field(
        ge=1, le=1024, description="Number of ranks to shard for (vLLM's --tensor-parallel-size), 1 to 1024."
    )
    max_part_bytes: Annotated[ByteSize, WholeBytes("preload.shard.maxPartBytes")] = Field(
        default=ByteSize("5Gi"),
        description="Size cap of one part file, in bytes: " + BYTE_SIZE_UNITS + ". Default 5Gi (what vLLM uses).",
    )


class Resources(CRDModel):
    """The preload container's core/v1 resources; values are Kubernetes quantities (cpu may be 500m)."""

    requests: dict[str, int | str] = Field(
        default_factory=lambda: {"cpu": "1", "memory": "2Gi"},  # type: ignore[arg-type]
        description='Resource requests, e.g. {cpu: "1", memory: 2Gi} (the default).',
    )
    limits: dict[str, int | str] = Field(
        default_factory=lambda: {"memory": "4Gi"},  # type: ignore[arg-type]
        description="Resource limits, e.g. {memory: 4Gi} (the default); keep memory above preload.memoryLimit.",
    )


class Preload(CRDModel):
    """How the preload Jobs copy the model: image, parallelism, memory, verification and retries."""

    image: str | None = Field(
        default=None, description="Runtime image with strata-loader; the operator's default when omitted."
    )
    image_pull_policy: PullPolicy = Field(
        default=PullPolicy.IF_NOT_PRESENT,
        description="Pull policy of the preload image: Always, IfNotPresent (default) or Never.",
    )
    concurrency: int = Field(
        default=16, ge=1, le=1024, description="Reads in flight against the source, 1 to 1024. Default 16."
    )
    block_size: Annotated[ByteSize, WholeBytes("preload.blockSize")] = Field(
        default=contract.DEFAULT_BLOCK_SIZE,
        description="Bytes per read from the source: "
        + BYTE_SIZE_UNITS
        + f". Default {contract.DEFAULT_BLOCK_SIZE.spelling}.",
    )
    memory_limit: Annotated[ByteSize, WholeBytes("preload.memoryLimit")] = Field(
        default=contract.DEFAULT_MEMORY_LIMIT,
        description="Bound on the preloader's buffer pool (bytes held in memory at once): "
        + BYTE_SIZE_UNITS
        + f". Default {contract.DEFAULT_MEMORY_LIMIT.spelling}; keep it below the container's memory limit.",
    )
    verify: VerifyMode = Field(
        default=VerifyMode.SIZES,
        description="How the copy is checked: sizes (default: every file's size), checksums (hash every file and "
        "compare with the source's checksums where it has them) or none.",
    )
    shard: ShardSpec | None = Field(
        default=None, description="Pre-shard for tensor parallelism after the copy; no sharding when omitted."
    )
    backoff_limit: int = Field(
        default=3, ge=0, le=100, description="Retries of a failed preload Job (its backoffLimit), 0 to 100. Default 3."
    )
    ttl_seconds_after_finished: int = Field(
        default=86400,
        ge=0,
        description="Seconds a finished preload Job is kept before Kubernetes deletes it. Default 86400 (a day); "
        "values under 60 are raised to 60.",
    )
    active_deadline_seconds: int | None = Field(
        default=None,
        ge=1,
        description="Seconds a preload Job may run before it is stopped and failed; no limit when omitted.",
    )
    resources: Resources = Field(default_factory=Resources, description="core/v1 resources of the preload container.")


COMPILE_CACHE_DEFAULT_MAX_BYTES = ByteSize("20Gi")
"""A vLLM engine's compile output is tens to hundreds of MB per configuration; 20Gi holds many keys (engine
releases, GPU types, configurations) of one model revision."""


class CompileCache(CRDModel):
    """The engines' compile cache, kept with the model: the first engine of a configuration compiles and its
    cache is captured beside the model's files; every later engine with the same compile key starts from it.
    See docs/compilecache.md."""

    enabled: bool = Field(
        default=False,
        description="Wire vLLM pods of this cache to the compile cache (default false): an init container computes "
        "the engine's compile key and restores a stored cache, and a capture sidecar stores the first engine's. "
        "SharedPVC and NodeLocal only: an ImageVolume is read-only, so a captured cache has nowhere to go.",
    )
    max_bytes: Annotated[ByteSize, WholeBytes("compileCache.maxBytes")] = Field(
        default=COMPILE_CACHE_DEFAULT_MAX_BYTES,
        description="Bytes the compile cache store may hold (every stored key, on the claim or on each node): "
        + BYTE_SIZE_UNITS
        + f". Default {COMPILE_CACHE_DEFAULT_MAX_BYTES.spelling}; a capture that would exceed it is refused and "
        "the store keeps what it had.",
    )


COMPILE_CACHE_ON = "has(self.compileCache) && self.compileCache.enabled"


class ModelCacheSpec(CRDModel):
    """Which model to cache, where to keep it, and how to copy it there."""

    source: ModelSource = Field(description="Where the model comes from (URI, revision, file filters, credentials).")
    storage: Storage = Field(description="Where the copy is kept: a shared claim, node-local disks or an image.")
    preload: Preload = Field(
        default_factory=Preload,
        description="How the preload Jobs copy the model; every setting has a default.",
        json_schema_extra={"default": {}},  # so the API server fills the nested defaults in
    )
    mount_path: str = Field(
        default="/models", pattern=r"^/.*", description="Where serving pods mount the model (status.volume)."
    )
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.DELETE,
        description="Delete removes node copies and a claim the operator created; Retain keeps them.",
    )
    compile_cache: CompileCache = Field(
        default_factory=CompileCache,
        description="The engines' compile cache, stored with the model (SharedPVC: a directory on the claim; "
        "NodeLocal: one in each node's copy); off by default.",
        json_schema_extra={"default": {}},
    )

    model_config = ConfigDict(
        json_schema_extra=_validations(
            cel(
                "(self.storage.mode == 'ImageVolume') == self.source.uri.startsWith('oci://')",
                "oci:// sources need storage.mode ImageVolume, and ImageVolume needs an oci:// source",
                field_path=".source.uri",
            ),
            cel(
                "!has(self.source.s3) || self.source.uri.startsWith('s3://')",
                "source.s3 is only allowed with an s3:// source",
                field_path=".source.s3",
            ),
            cel(
                f"!({COMPILE_CACHE_ON}) || self.storage.mode != 'ImageVolume'",
                "compileCache.enabled is not supported with storage.mode ImageVolume: an image volume is read-only, "
                "so a captured compile cache has nowhere to go; use SharedPVC or NodeLocal, or leave compileCache "
                "off",
                field_path=".compileCache.enabled",
                reason="FieldValueForbidden",
            ),
            cel(
                f"!({COMPILE_CACHE_ON}) || self.storage.mode != 'SharedPVC' || !has(self.storage.sharedPVC) || "
                "!has(self.storage.sharedPVC.accessMode) || self.storage.sharedPVC.accessMode != 'ReadOnlyMany'",
                "compileCache.enabled needs a claim the capture sidecar can write: storage.sharedPVC.accessMode "
                "ReadOnlyMany cannot hold a captured compile cache; use ReadWriteMany, or leave compileCache off",
                field_path=".compileCache.enabled",
                reason="FieldValueForbidden",
            ),
        )
    )

    @model_validator(mode="after")
    def _compile_cache_has_a_store(self) -> ModelCacheSpec:
        """The model's side of the two compileCache rules above (a spec stored under an older CRD)."""
        if not self.compile_cache.enabled:
            return self
        if self.storage.mode == StorageMode.IMAGE_VOLUME:
            raise ValueError("compileCache.enabled is not supported with storage.mode ImageVolume (read-only)")
        shared = self.storage.shared_pvc
        if self.storage.mode == StorageMode.SHARED_PVC and shared and shared.access_mode == "ReadOnlyMany":
            raise ValueError("compileCache.enabled needs a writable claim, not accessMode ReadOnlyMany")
        return self


class NodeStateBeforeLoss(CRDModel):
    """A node's state as it was when its node stopped being Ready."""

    phase: str = Field(description="The phase it had (Ready, Preloading, ...).")
    message: str | None = Field(default=None, description="The message it had.")


class NodeState(CRDModel):
    """One node's copy (NodeLocal) or pre-pull (ImageVolume)."""

    name: str = Field(description="The node's name.")
    phase: str = Field(
        description="Pending, Waiting (fan-out: for the first copy or a ready peer), Preloading, Ready, Failed, "
        "InsufficientStorage (the copy does not fit the node's budget even after eviction; the message has the "
        "numbers), Evicted (removed to make room for another cache's copy; the node label reads Evicted) or "
        "NodeNotReady (the node stopped being Ready: the message says why; what it was is in beforeNodeLoss and "
        "comes back when the node does)."
    )
    job: str | None = Field(default=None, description="The Job that copies (or pre-pulls) on this node.")
    bytes: int | None = Field(default=None, description="Bytes of the verified copy on this node.")
    files: int | None = Field(default=None, description="Files in the verified copy on this node.")
    seconds: float | None = Field(default=None, description="How long this node's copy took, in seconds.")
    manifest_sha256: str | None = Field(
        default=None, description="SHA-256 of this node's manifest (fan-out trusts the first copy's, see fanOut)."
    )
    message: str | None = Field(default=None, description="What happened on this node, for people.")
    recreations: int | None = Field(default=None, description="Times its Job vanished before its result was read.")
    retry_after: str | None = Field(default=None, description="When the vanished Job is created again.")
    used_bytes: int | None = Field(
        default=None,
        description="Bytes used on the node path's filesystem (df's Used), measured by the preload Job when it "
        "ended; only under a NodeCachePolicy.",
    )
    free_bytes: int | None = Field(
        default=None,
        description="Bytes free on the node path's filesystem (df's Avail), measured by the preload Job when it "
        "ended; only under a NodeCachePolicy.",
    )
    policy: str | None = Field(default=None, description="The NodeCachePolicy whose budget the Job kept to.")
    evicted: list[str] | None = Field(
        default=None, description="Copies (<namespace>/<name>) the Job evicted on this node to make room."
    )
    last_used: str | None = Field(
        default=None,
        description="When the copy was last seen in use on this node (or became Ready): least recently used "
        "copies are evicted first.",
    )
    before_node_loss: NodeStateBeforeLoss | None = Field(
        default=None,
        description="NodeNotReady: the phase and message this node had when it stopped being Ready; its Job and "
        "copy are kept, and the node resumes from here when it is Ready again.",
    )


class FanOutStatus(CRDModel):
    """Where the fan-out stands."""

    phase: str = Field(
        description="Seeding (the first node reads the source), Serving (peers serve the other nodes), "
        "Origin (no peer in time: the rest read the source) or Done (every node Ready; peers removed)."
    )
    peers_ready: int | None = Field(default=None, description="Peer servers ready to serve.")
    waiting_since: str | None = Field(default=None, description="When the other nodes started to wait for a peer.")
    service: str | None = Field(default=None, description="The headless Service the other nodes' Jobs reach peers by.")
    manifest_sha256: str | None = Field(
        default=None,
        description="The manifest every peer must prove it holds (the first Ready copy's): fetchers refuse any other.",
    )
    message: str | None = Field(default=None, description="What the fan-out is doing, for people.")


class ImageStatus(CRDModel):
    """ImageVolume: what the oci:// reference was resolved to. Nodes pull `reference` (a digest), so a tag that
    moves later cannot change what they serve; the annotation strata.dev/resolve-image asks for a new resolution."""

    reference: str | None = Field(default=None, description="registry/repository@sha256:...: what nodes pull.")
    digest: str | None = Field(default=None, description="The digest the tag named (the index's, if any).")
    resolved_from: str | None = Field(default=None, description="The reference that was resolved (the tag).")
    resolved_at: str | None = Field(default=None, description="When it was resolved.")
    resolve_request: str | None = Field(
        default=None, description="The value of the annotation strata.dev/resolve-image this resolution answered."
    )
    platform: str | None = Field(default=None, description="The platform whose manifest sizeBytes counts.")
    platform_digest: str | None = Field(default=None, description="That platform's manifest digest.")
    size_bytes: int | None = Field(default=None, description="Bytes of that manifest's layers: what a node pulls.")
    layers: int | None = Field(default=None, description="Layers in that manifest.")
    failures: int | None = Field(default=None, description="Failed resolutions in a row (reset by a success).")
    next_attempt: str | None = Field(default=None, description="When a failed resolution is tried again.")
    reason: str | None = Field(default=None, description="Why the last resolution failed, as a condition reason.")
    message: str | None = Field(default=None, description="Why the last resolution failed, from the registry.")
    transient: bool | None = Field(
        default=None,
        description="The last failure may pass by itself (the registry unreachable): the cache is Reconciling "
        "until the next attempt, not Stalled.",
    )


class CompileCacheEntry(CRDModel):
    """One compile key the store holds, as the sidecar that captured it or the engines that restored it reported
    it."""

    key: str = Field(description="The compile key's SHA-256 (the store's directory name).")
    summary: str | None = Field(default=None, description="The key for people: engine, torch, target.")
    generation: str | None = Field(
        default=None, description="The newest stored generation captured or restored by an engine."
    )
    captured: str | None = Field(default=None, description="When that generation was captured.")
    bytes: int | None = Field(default=None, description="Bytes of that generation.")
    size: str | None = Field(default=None, description="bytes for humans.")
    files: int | None = Field(default=None, description="Files in that generation.")
    nodes: list[str] | None = Field(
        default=None,
        description="NodeLocal: the nodes whose store holds it, captured or restored there (each node has its own).",
    )


class CompileCaptureFailure(CRDModel):
    """A live engine's capture that stored nothing, from its capture sidecar's log."""

    pod: str = Field(description="The engine's pod.")
    key: str = Field(description="The compile key it tried to store.")
    outcome: str = Field(description="not-captured (no complete compile in time) or refused.")
    reason: str = Field(description="Why, as the sidecar said it.")


class CompileCacheStatus(CRDModel):
    """What the engines' restore init containers (their termination messages) and capture sidecars (their logs)
    reported, counted over the live consumer pods, and the keys the store holds."""

    store: str | None = Field(default=None, description="Where the store is: the claim's or each node's directory.")
    hits: int = Field(default=0, description="Live engines that started from a stored compile cache.")
    misses: int = Field(default=0, description="Live engines that found none for their key (they compile).")
    capturing: int = Field(
        default=0, description="Of the misses, the engines whose capture has not said how it ended yet."
    )
    last_miss: str | None = Field(default=None, description="The newest miss's reason (the parts that differ).")
    caches: list[CompileCacheEntry] = Field(
        default_factory=list, description="The keys captured or restored, newest capture first (at most 16)."
    )
    capture_failures: list[CompileCaptureFailure] = Field(
        default_factory=list, description="Live engines whose capture stored nothing, with why (at most 16)."
    )
    capture_logs_forbidden: str | None = Field(
        default=None,
        description="Why the operator cannot read the capture sidecars' logs (the API server refuses it get on "
        "pods/log here) and what to grant; the captures stay awaited meanwhile. Absent while the logs are readable.",
    )
    summary: str | None = Field(default=None, description="Keys, hits and misses for humans (printer column).")


class ModelCacheStatus(CRDModel):
    """What the operator observed: the copy's progress and where serving pods find the model."""

    phase: str | None = Field(default=None, description="Pending, Preloading, Ready, Degraded or Failed.")
    observed_generation: int | None = Field(
        default=None, description="The metadata.generation this status was computed from."
    )
    conditions: list[Condition] = Field(
        default_factory=list, description="Ready, Progressing and Degraded, with reasons and messages."
    )
    preload_hash: str | None = Field(default=None, description="Hash of the fetch request now wanted.")
    claim_name: str | None = Field(default=None, description="SharedPVC: the claim holding the model.")
    claim_uid: str | None = Field(default=None, description="The claim the last successful preload filled.")
    job: str | None = Field(default=None, description="SharedPVC: the preload Job that fills the claim.")
    resolved_revision: str | None = Field(
        default=None, description="The revision the preloader copied (for Hugging Face, the commit a branch named)."
    )
    resolved_from: str | None = Field(
        default=None,
        description="NodeLocal: source.revision as it was when resolvedRevision was recorded; while the spec still "
        "asks for it, nodes that start later copy resolvedRevision (a moving hf:// branch gives every node one "
        "commit).",
    )
    total_bytes: int | None = Field(default=None, description="Bytes of the model's copied files.")
    total_files: int | None = Field(default=None, description="Number of the model's copied files.")
    size: str | None = Field(default=None, description="totalBytes for humans (printer column).")
    seconds: float | None = Field(default=None, description="How long the last successful preload took, in seconds.")
    manifest_sha256: str | None = Field(
        default=None, description="SHA-256 of the copy's manifest: equal values mean the same files, byte for byte."
    )
    ready_nodes: int | None = Field(default=None, description="NodeLocal/ImageVolume: nodes whose copy is Ready.")
    desired_nodes: int | None = Field(default=None, description="NodeLocal/ImageVolume: nodes that should have one.")
    nodes: list[NodeState] = Field(
        default_factory=list, description="NodeLocal/ImageVolume: the state of each selected node's copy."
    )
    node_label: str | None = Field(default=None, description="Label `<key>=Ready` on nodes holding a copy.")
    fan_out: FanOutStatus | None = Field(
        default=None, description="NodeLocal with more than one node: how the copies are read once and fanned out."
    )
    volume: dict[str, Any] | None = Field(
        default=None,
        description="What a serving pod pastes in: volume, volumeMount and, for NodeLocal, nodeSelector; for "
        "ImageVolume the volume names the digest and imagePullSecrets the pull Secret.",
    )
    image: ImageStatus | None = Field(default=None, description="ImageVolume: the resolved image.")
    consumers: int | None = Field(
        default=None,
        description="Running or pending pods labelled strata.dev/model-cache with this cache's name: what "
        "deleting it would break.",
    )
    compile_cache: CompileCacheStatus | None = Field(
        default=None, description="compileCache.enabled: the stored compile keys and the engines' hits and misses."
    )


Credentials.model_rebuild()

CRD = CRDSpec(
    kind="ModelCache",
    plural="modelcaches",
    short_names=("mc",),
    spec_model=ModelCacheSpec,
    status_model=ModelCacheStatus,
    printer_columns=(
        PrinterColumn("Mode", ".spec.storage.mode"),
        PrinterColumn("Phase", ".status.phase"),
        PrinterColumn("Size", ".status.size"),
        PrinterColumn("Ready Nodes", ".status.readyNodes", "integer"),
        PrinterColumn("Compile Cache", ".status.compileCache.summary"),
        PrinterColumn("Source", ".spec.source.uri", priority=1),
        PrinterColumn("Revision", ".status.resolvedRevision", priority=1),
    ),
    root_validations=(
        cel(
            "self.metadata.name.size() <= 63",
            "metadata.name must be at most 63 characters: Strata uses it in label values",
            reason="FieldValueInvalid",
        ),
    ),
    description="A model's files made available to serving pods (shared PVC, node-local copies or image volume).",
)
