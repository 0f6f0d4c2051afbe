"""ModelCache: get a model's files somewhere pods can read them fast, once, and say where."""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from strata_operator.api.base import Condition, CRDModel, cel
from strata_operator.api.crdgen import CRDSpec, PrinterColumn


class StorageMode(StrEnum):
    SHARED_PVC = "SharedPVC"
    NODE_LOCAL = "NodeLocal"
    IMAGE_VOLUME = "ImageVolume"


class ModelSource(CRDModel):
    uri: str = Field(
        pattern=r"^(s3|hf|pvc|oci)://.+",
        description="Where the model comes from: s3://bucket/prefix, hf://org/name, pvc://claim/path, oci://ref.",
        json_schema_extra={"x-kubernetes-validations": [cel("self == oldSelf", "source.uri is immutable")]},
    )


class Storage(CRDModel):
    mode: StorageMode = Field(description="SharedPVC, NodeLocal or ImageVolume.")


class ModelCacheSpec(CRDModel):
    source: ModelSource
    storage: Storage


class ModelCacheStatus(CRDModel):
    phase: str | None = None
    observed_generation: int | None = None
    conditions: list[Condition] = Field(default_factory=list)


CRD = CRDSpec(
    kind="ModelCache",
    plural="modelcaches",
    short_names=("mc",),
    spec_model=ModelCacheSpec,
    status_model=ModelCacheStatus,
    printer_columns=(
        PrinterColumn("Mode", ".spec.storage.mode"),
        PrinterColumn("Phase", ".status.phase"),
    ),
    description="A model's files made available to serving pods (shared PVC, node-local copies or image volume).",
)
