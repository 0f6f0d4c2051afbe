"""ModelCache: get a model's files somewhere pods can read them fast, once, and say where.

The spec and status models, their defaults and the CEL rules the API server enforces live here; the CRD in
`crds/modelcaches.strata.dev.yaml` is generated from them (`make crds`).
"""

from __future__ import annotations

import re
from enum import StrEnum
from typing import Annotated, Any

from pydantic import AfterValidator, ConfigDict, Field, model_validator

from strata_operator.api.base import (
    HOST_PATH_RULES,
    Condition,
    CRDModel,
    HostDirectory,
    PullPolicy,
    allow_link_local_field,
    cel,
    endpoint_problem,
    endpoint_rules,
)
from strata_operator.api.crdgen import CRDSpec, PrinterColumn

QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?$"
"""A storage size as a Kubernetes quantity (`500Gi`, `1.5T`) with the API server's own suffixes: not `1g` or `1K`,
which a claim would refuse, nor milli (`500m`), which is no size for a volume."""

BYTE_COUNT_PATTERN = r"^0*[1-9][0-9]*(Ki|Mi|Gi|Ti|k|M|G|T)?$"
"""A whole, positive number of bytes as the preloader reads it: digits with an optional binary or decimal suffix.
No fractions (`1.5Gi`), and no `m`: a Kubernetes quantity reads it as milli, the loader as mega."""
BYTE_COUNT_RULE = (
    "must be a whole number of bytes above 0: an integer, or an integer followed by Ki, Mi, Gi or Ti (powers "
    "of 1024) or k, M, G or T (powers of 1000), e.g. 16Mi; not a fraction such as 1.5Gi nor milli such as 500m"
)

DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


class StorageMode(StrEnum):
    SHARED_PVC = "SharedPVC"
    NODE_LOCAL = "NodeLocal"
    IMAGE_VOLUME = "ImageVolume"


class DeletionPolicy(StrEnum):
    """What happens to the model's bytes when the ModelCache is deleted."""

    DELETE = "Delete"
    RETAIN = "Retain"


class VerifyMode(StrEnum):
    """Mirrors `strata_loader.contract.VerifyMode`; a unit test keeps the two in step."""

    SIZES = "sizes"
    CHECKSUMS = "checksums"
    NONE = "none"


def _validations(*rules: dict[str, str]) -> dict[str, Any]:
    """`json_schema_extra` carrying CEL rules; crdgen copies them into the CRD as they are."""
    return {"x-kubernetes-validations": list(rules)}


def _whole_bytes(value: int | str) -> int | str:
    """The model's side of the CEL rule below, so a spec stored under an older CRD is refused as well."""
    if isinstance(value, bool) or (isinstance(value, int) and value < 1):
        raise ValueError(f"{value!r} {BYTE_COUNT_RULE}")
    if isinstance(value, str) and not re.fullmatch(BYTE_COUNT_PATTERN, value):
        raise ValueError(f"{value!r} {BYTE_COUNT_RULE}")
    return value


ByteCount = Annotated[
    int | str,
    AfterValidator(_whole_bytes),
    Field(
        json_schema_extra=_validations(
            cel(
                f"type(self) == int ? self > 0 : self.matches('{BYTE_COUNT_PATTERN}')",
                BYTE_COUNT_RULE,
            )
        )
    ),
]
"""A byte count in a spec (int-or-string in the CRD): checked by the API server and again by the model."""


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
        "AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, HF_TOKEN, ...).",
    )
    service_account_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN_PATTERN,
        max_length=253,
        description="Service account the preloader runs as (IRSA, GKE/Azure workload identity).",
    )


class SecretRef(CRDModel):
    name: str = Field(min_length=1, max_length=253, pattern=DNS_SUBDOMAIN_PATTERN)


class S3Options(CRDModel):
    model_config = ConfigDict(json_schema_extra=_validations(*endpoint_rules("source.s3", "the preloader")))

    endpoint: str | None = Field(
        default=None,
        pattern=r"^https?://.+",
        max_length=2048,
        description="S3-compatible endpoint URL (MinIO, Ceph, R2). Link-local and cloud metadata addresses are "
        "refused unless allowLinkLocal is set; IPv4 addresses must be written dotted-decimal.",
    )
    region: str | None = Field(default=None, max_length=64)
    allow_link_local: bool = allow_link_local_field()

    @model_validator(mode="after")
    def _endpoint_is_no_metadata_service(self) -> S3Options:
        if problem := endpoint_problem(self.endpoint, self.allow_link_local, "source.s3", "the preloader"):
            raise ValueError(problem)
        return self


class ModelSource(CRDModel):
    uri: str = Field(
        pattern=r"^(s3://[a-z0-9][a-z0-9.\-]{1,62}(/.*)?|hf://[A-Za-z0-9_.\-]+/[A-Za-z0-9_.\-]+/?"
        r"|pvc://[a-z0-9][a-z0-9.\-]*(/.*)?|oci://.+)$",
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
        description="Hugging Face revision (branch, tag or commit); for S3 a label recorded in status. Must not "
        "start with '-'.",
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
    credentials: Credentials | None = None
    s3: S3Options | None = None


class SharedPVCStorage(CRDModel):
    claim_name: str | None = Field(
        default=None,
        pattern=DNS_SUBDOMAIN_PATTERN,
        max_length=253,
        description="An existing claim to fill (adopted, never deleted); when omitted the operator creates "
        "<name>-model.",
    )
    size: str | None = Field(
        default=None,
        pattern=QUANTITY_PATTERN,
        description="Size of the claim the operator creates: a quantity with Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P or "
        "E (e.g. 200Gi).",
    )
    storage_class_name: str | None = Field(default=None, max_length=253)
    access_mode: str = Field(
        default="ReadWriteMany",
        json_schema_extra={"enum": ["ReadWriteMany", "ReadOnlyMany", "ReadWriteOnce", "ReadWriteOncePod"]},
    )


class NodeLocalStorage(CRDModel):
    path: HostDirectory = Field(
        default="/var/lib/strata/models",
        description="Directory on each node (NVMe) that must exist and be writable by UID 65532; the copy "
        "lands in <path>/<namespace>/<name>, which deletion removes." + HOST_PATH_RULES,
    )
    node_selector: dict[str, str] = Field(default_factory=dict, description="Nodes that get a copy.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list)


class ImageVolumeStorage(CRDModel):
    pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    pre_pull: bool = Field(default=False, description="Pull the image on every selected node ahead of use.")
    node_selector: dict[str, str] = Field(default_factory=dict, description="Nodes to pre-pull on.")
    tolerations: list[dict[str, Any]] = Field(default_factory=list)


def _only_with_mode(field: str, mode: str) -> dict[str, str]:
    return cel(
        f"self.mode == '{mode}' || !has(self.{field})",
        f"storage.{field} is only allowed when storage.mode is {mode}",
        reason="FieldValueForbidden",
    )


class Storage(CRDModel):
    mode: StorageMode = Field(
        description="SharedPVC, NodeLocal or ImageVolume. Immutable.",
        json_schema_extra=_validations(
            cel("self == oldSelf", "storage.mode is immutable; create a new ModelCache to change it")
        ),
    )
    shared_pvc: SharedPVCStorage | None = Field(default=None, alias="sharedPVC")
    node_local: NodeLocalStorage | None = None
    image_volume: ImageVolumeStorage | None = None

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
    tensor_parallel_size: int = Field(ge=1, le=1024)
    max_part_bytes: ByteCount = Field(
        default="5Gi", description="Size cap of one part file: bytes, or an integer with Ki, Mi, Gi, Ti, k, M, G or T."
    )


class Resources(CRDModel):
    requests: dict[str, int | str] = Field(default_factory=lambda: {"cpu": "1", "memory": "2Gi"})  # type: ignore[arg-type]
    limits: dict[str, int | str] = Field(default_factory=lambda: {"memory": "4Gi"})  # type: ignore[arg-type]


class Preload(CRDModel):
    image: str | None = Field(
        default=None, description="Runtime image with strata-loader; the operator's default when omitted."
    )
    image_pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    concurrency: int = Field(default=16, ge=1, le=1024, description="Reads in flight.")
    block_size: ByteCount = Field(
        default="16Mi", description="Bytes per read: an integer, or an integer with Ki, Mi, Gi, Ti, k, M, G or T."
    )
    memory_limit: ByteCount = Field(
        default="1Gi",
        description="Buffer pool bound of the preloader: bytes, or an integer with Ki, Mi, Gi, Ti, k, M, G or T.",
    )
    verify: VerifyMode = VerifyMode.SIZES
    shard: ShardSpec | None = None
    backoff_limit: int = Field(default=3, ge=0, le=100)
    ttl_seconds_after_finished: int = Field(default=86400, ge=0, description="Values under 60 are raised to 60.")
    active_deadline_seconds: int | None = Field(default=None, ge=1)
    resources: Resources = Field(default_factory=Resources)


class ModelCacheSpec(CRDModel):
    source: ModelSource
    storage: Storage
    preload: Preload = Field(
        default_factory=Preload,
        json_schema_extra={"default": {}},  # so the API server fills the nested defaults in
    )
    mount_path: str = Field(
        default="/models", pattern=r"^/.*", description="Where serving pods mount the model (status.volume)."
    )
    deletion_policy: DeletionPolicy = Field(
        default=DeletionPolicy.DELETE,
        description="Delete removes node copies and a claim the operator created; Retain keeps them.",
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
        )
    )


class NodeState(CRDModel):
    """One node's copy (NodeLocal) or pre-pull (ImageVolume)."""

    name: str
    phase: str = Field(description="Pending, Preloading, Ready or Failed.")
    job: str | None = None
    bytes: int | None = None
    files: int | None = None
    seconds: float | None = None
    message: str | None = None
    recreations: int | None = Field(default=None, description="Times its Job vanished before its result was read.")
    retry_after: str | None = Field(default=None, description="When the vanished Job is created again.")


class ModelCacheStatus(CRDModel):
    phase: str | None = Field(default=None, description="Pending, Preloading, Ready, Degraded or Failed.")
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)
    preload_hash: str | None = Field(default=None, description="Hash of the fetch request now wanted.")
    claim_name: str | None = None
    claim_uid: str | None = Field(default=None, description="The claim the last successful preload filled.")
    job: str | None = None
    resolved_revision: str | None = None
    total_bytes: int | None = None
    total_files: int | None = None
    size: str | None = Field(default=None, description="totalBytes for humans (printer column).")
    seconds: float | None = None
    manifest_sha256: str | None = None
    ready_nodes: int | None = None
    desired_nodes: int | None = None
    nodes: list[NodeState] = Field(default_factory=list)
    node_label: str | None = Field(default=None, description="Label `<key>=Ready` on nodes holding a copy.")
    volume: dict[str, Any] | None = Field(
        default=None,
        description="What a serving pod pastes in: volume, volumeMount and, for NodeLocal, nodeAffinity.",
    )
    consumers: int | None = Field(
        default=None,
        description="Running or pending pods labelled strata.dev/model-cache with this cache's name: what "
        "deleting it would break.",
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
