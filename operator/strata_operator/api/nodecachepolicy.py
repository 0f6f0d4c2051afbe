"""NodeCachePolicy (cluster-scoped): the budget of a node path that NodeLocal ModelCache copies share.

A platform team sets it once per kind of node (its selector) and host path: how full the path's filesystem may
get (the high watermark, in percent of what `df` shows) and how far least recently used copies are evicted when
a new copy does not fit (the low watermark). The operator reads policies when it creates a node's preload Job and
hands the Job the budget and the copies it may evict; the Job measures the filesystem itself (see
`strata_loader.eviction`). Without a policy for a node and path, copies are not evicted there (a copy that does
not fit fails, as before). The CRD in `crds/nodecachepolicies.strata.dev.yaml` is generated from this module.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import ConfigDict, Field, model_validator

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


class NodeCachePolicySpec(CRDModel):
    """Which nodes and host path the budget covers, and the watermarks on that path's filesystem."""

    model_config = ConfigDict(json_schema_extra=_ORDERED)

    node_selector: dict[str, str] = Field(
        default_factory=dict,
        description='Labels of the nodes this policy covers, e.g. {node.kubernetes.io/instance-type: "p5.48xlarge"}; '
        "every node when empty. When several policies cover a node and path, the first by name applies.",
    )

    min_free: Annotated[int | str, WholeBytes("minFree", minimum=0)] | None = Field(
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
    ),
    description="The budget NodeLocal model copies share on a node path: high/low watermarks on its filesystem "
    "and least-recently-used eviction of copies no pod uses.",
)
