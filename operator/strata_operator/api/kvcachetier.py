"""KVCacheTier: a KV cache server on every matching GPU node, and how vLLM reaches it."""

from __future__ import annotations

from pydantic import Field

from strata_operator.api.base import Condition, CRDModel
from strata_operator.api.crdgen import CRDSpec, PrinterColumn


class KVCacheTierSpec(CRDModel):
    node_selector: dict[str, str] = Field(default_factory=dict)


class KVCacheTierStatus(CRDModel):
    observed_generation: int | None = None
    desired_instances: int | None = None
    ready_instances: int | None = None
    conditions: list[Condition] = Field(default_factory=list)


CRD = CRDSpec(
    kind="KVCacheTier",
    plural="kvcachetiers",
    short_names=("kvt",),
    spec_model=KVCacheTierSpec,
    status_model=KVCacheTierStatus,
    printer_columns=(
        PrinterColumn("Ready", ".status.readyInstances", "integer"),
        PrinterColumn("Desired", ".status.desiredInstances", "integer"),
    ),
    description="A per-node KV cache tier server (DRAM L1, filesystem/S3 L2) for vLLM.",
)
