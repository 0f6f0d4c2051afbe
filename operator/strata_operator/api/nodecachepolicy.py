"""NodeCachePolicy (cluster-scoped): the budget of a node path that NodeLocal ModelCache copies share.

A platform team sets it once per kind of node (its selector) and host path: how full the path's filesystem may
get (the high watermark, in percent of what `df` shows), how far least recently used copies are evicted when
a new copy does not fit (the low watermark), how many bytes each namespace's copies may take on one node, which
copies are never evicted, and whether one namespace's caches may evict another's (not by default). These are the
platform team's calls, not the tenants': a tenant's own ModelCache cannot raise its budget, pin itself against
other namespaces or evict them. The operator reads policies when it creates a node's preload Job and hands the
Job the budget and the copies it may evict; the Job measures the filesystem itself (see
`strata_loader.fetch.eviction`). Without a policy for a node and path, copies are not evicted there (a copy that does
not fit fails, as before). The CRD in `crds/nodecachepolicies.strata.dev.yaml` is generated from this module.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator
from strata_units import ByteSize

from strata_operator.api.base import BYTE_SIZE_UNITS, HOST_PATH_RULES, CRDModel, HostDirectory, WholeBytes, cel
from strata_operator.api.crdgen import CRDSpec, PrinterColumn

DEFAULT_HIGH_WATERMARK = 90
DEFAULT_LOW_WATERMARK = 80


_ORDERED: dict[str, Any] = {
    "x-kubernetes-validations": [
        cel(
            "self.lowWatermark < self.highWatermark",
            "lowWatermark must be below highWatermark (eviction goes down to the low one when a new copy would pass "
            "the high one), e.g. highWatermark: 90, lowWatermark: 80",
            field_path=".lowWatermark",
            reason="FieldValueInvalid",
        )
    ]
}


NAMESPACE_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"


class PinnedCaches(CRDModel):
    """ModelCaches whose copies no other cache's preload may evict under this policy."""

    namespace: str = Field(
        min_length=1, max_length=63, pattern=NAMESPACE_PATTERN, description="The namespace of the caches, e.g. team-a."
    )
    names: list[Annotated[str, Field(min_length=1, max_length=253, pattern=NAME_PATTERN)]] = Field(
        default_factory=list,
        max_length=256,
        description="ModelCache names in that namespace, e.g. [llama-70b]; every cache of the namespace when empty.",
    )

    def covers(self, namespace: str, name: str) -> bool:
        return namespace == self.namespace and (not self.names or name in self.names)


class NamespaceBudget(CRDModel):
    """One namespace's byte budget on each node the policy covers, instead of `namespaceBudget`."""

    namespace: str = Field(
        min_length=1, max_length=63, pattern=NAMESPACE_PATTERN, description="The namespace, e.g. team-a."
    )
    max_bytes: Annotated[ByteSize, WholeBytes("namespaceBudgets[].maxBytes", minimum=0)] = Field(
        description="Bytes that namespace's copies may take on one node's path (as `du` counts them, with "
        "copies being written), in bytes: " + BYTE_SIZE_UNITS + " (e.g. 2Ti); 0 allows none.",
    )


class NodeCachePolicySpec(CRDModel):
    """Which nodes and host path the budget covers, and the watermarks on that path's filesystem."""

    model_config = ConfigDict(json_schema_extra=_ORDERED)

    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description='Labels of the nodes this policy covers, e.g. {node.kubernetes.io/instance-type: "p5.48xlarge"}; '
        "every node when empty. When several policies cover a node and path, the first by name applies.",
    )

    min_free: Annotated[ByteSize, WholeBytes("minFree", minimum=0)] | None = Field(
        default=None,
        description="Bytes that must stay free on the filesystem whatever the watermarks allow (room for logs, "
        "images, scratch), in bytes: " + BYTE_SIZE_UNITS + " (e.g. 200Gi). The tighter of the two limits applies; "
        "none when omitted.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> NodeCachePolicySpec:
        if not self.low_watermark < self.high_watermark:
            raise ValueError(f"lowWatermark {self.low_watermark} must be below highWatermark {self.high_watermark}")
        return self

    path: HostDirectory = Field(
        default="/var/lib/strata/models",
        description="The host directory whose filesystem the budget measures: ModelCaches with the same "
        "storage.nodeLocal.path share it (default /var/lib/strata/models, the ModelCache default)." + HOST_PATH_RULES,
    )
    high_watermark: int = Field(
        default=DEFAULT_HIGH_WATERMARK,
        ge=1,
        le=100,
        description="Percent of the filesystem (df's Use%) a new copy may fill it up to, 1 to 100. Default 90. A "
        "copy that would pass it evicts least recently used copies first; one that still would ends "
        "InsufficientStorage on that node.",
    )
    low_watermark: int = Field(
        default=DEFAULT_LOW_WATERMARK,
        ge=0,
        le=99,
        description="Percent eviction brings usage (with the new copy) down to, so the next copy does not evict "
        "again at once; below highWatermark. Default 80.",
    )
    evict_across_namespaces: bool = Field(
        default=False,
        description="Whether one namespace's new copy may evict other namespaces' idle copies on the node. Default "
        "false: a cache evicts only copies of its own namespace, and a copy that does not fit otherwise waits "
        "(InsufficientStorage) until space is freed. true: any namespace's idle copies are candidates, least "
        "recently used first, except those in `pinned` (a ModelCache's own storage.nodeLocal.pinned then only "
        "keeps it from caches of its own namespace).",
    )
    namespace_budget: Annotated[ByteSize, WholeBytes("namespaceBudget", minimum=0)] | None = Field(
        default=None,
        description="Bytes each namespace's copies may take on one node's path (what `du` counts, with copies "
        "being written), in bytes: " + BYTE_SIZE_UNITS + " (e.g. 500Gi); unlimited when omitted (the watermarks "
        "still apply). A namespace's new copy that would pass it evicts that namespace's own idle copies, and "
        "ends InsufficientStorage when they are not enough. namespaceBudgets overrides it per namespace.",
    )
    namespace_budgets: list[NamespaceBudget] = Field(
        default_factory=list,
        max_length=1024,
        description="Per-namespace budgets that replace namespaceBudget for the namespaces listed, e.g. "
        "[{namespace: team-a, maxBytes: 2Ti}]. A namespace listed twice gets the first entry.",
    )
    pinned: list[PinnedCaches] = Field(
        default_factory=list,
        max_length=1024,
        description="Caches whose copies are never evicted on the nodes this policy covers, e.g. [{namespace: "
        "team-a, names: [llama-70b]}]. Only this list protects a copy from other namespaces; a pinned copy still "
        "counts against its namespace's budget.",
    )

    def budget_of(self, namespace: str) -> ByteSize | None:
        """The namespace's byte budget on one node, None when unlimited."""
        for entry in self.namespace_budgets:
            if entry.namespace == namespace:
                return entry.max_bytes
        return self.namespace_budget

    def pins(self, namespace: str, name: str) -> bool:
        return any(p.covers(namespace, name) for p in self.pinned)


class NodeCachePolicyStatus(CRDModel):
    """Not written yet: what each node holds is reported by the ModelCaches (status.nodes[].usedBytes)."""

    observed_generation: int | None = Field(
        default=None, description="Reserved: the metadata.generation a status was computed from."
    )


CRD = CRDSpec(
    kind="NodeCachePolicy",
    plural="nodecachepolicies",
    short_names=("ncp",),
    spec_model=NodeCachePolicySpec,
    status_model=NodeCachePolicyStatus,
    scope="Cluster",
    printer_columns=(
        PrinterColumn("Path", ".spec.path"),
        PrinterColumn("High", ".spec.highWatermark", "integer"),
        PrinterColumn("Low", ".spec.lowWatermark", "integer"),
        PrinterColumn("Namespace Budget", ".spec.namespaceBudget"),
        PrinterColumn("Across Namespaces", ".spec.evictAcrossNamespaces", "boolean"),
    ),
    description="The budget NodeLocal model copies share on a node path: high/low watermarks on its filesystem, "
    "per-namespace byte budgets, pinned caches, and least-recently-used eviction of copies no pod uses (within "
    "a namespace unless evictAcrossNamespaces).",
)
