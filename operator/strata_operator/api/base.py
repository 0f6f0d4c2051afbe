"""Base model for CRD types: camelCase on the wire, snake_case in Python, unknown fields rejected."""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel


class CRDModel(BaseModel):
    """Every spec/status model derives from this so the CRD schema and the parser agree on field names."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    def to_k8s(self) -> dict[str, Any]:
        """The object as the API server stores it: camelCase keys, unset optionals left out."""
        return self.model_dump(by_alias=True, exclude_none=True, mode="json")


class PullPolicy(StrEnum):
    """core/v1 imagePullPolicy."""

    ALWAYS = "Always"
    IF_NOT_PRESENT = "IfNotPresent"
    NEVER = "Never"


class Condition(CRDModel):
    """A Kubernetes-style condition (the shape kstatus, Flux and Argo CD read)."""

    type: str
    status: Literal["True", "False", "Unknown"]
    reason: str = Field(pattern=r"^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$", max_length=1024)
    message: str = Field(default="", max_length=32768)
    observed_generation: int | None = Field(default=None, ge=0)
    last_transition_time: str


class SecretKeyRef(CRDModel):
    """A key of a Secret in the resource's namespace: the only way credentials enter a spec."""

    name: str = Field(min_length=1, max_length=253)
    key: str | None = Field(default=None, description="Key inside the Secret; all keys when omitted.")


def cel(rule: str, message: str, *, field_path: str | None = None, reason: str | None = None) -> dict[str, str]:
    """One `x-kubernetes-validations` entry; the message is what `kubectl apply` shows the user."""
    entry = {"rule": rule, "message": message}
    if field_path:
        entry["fieldPath"] = field_path
    if reason:
        entry["reason"] = reason
    return entry
