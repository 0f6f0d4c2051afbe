"""Turn pydantic models into a CustomResourceDefinition with a structural OpenAPI v3 schema.

Pydantic emits JSON Schema with `$ref`s, `anyOf` for optionals and titles; the API server wants a
structural schema: everything inlined, one type per node, `nullable` never needed because unset
optionals are simply omitted. CEL rules, int-or-string and embedded objects come from
`json_schema_extra` on the models and fields.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from strata_operator.api import GROUP, VERSION

_DROP_KEYS = {"title", "$defs", "discriminator"}


@dataclass(frozen=True)
class PrinterColumn:
    name: str
    json_path: str
    type: str = "string"
    description: str = ""
    priority: int = 0

    def to_k8s(self) -> dict[str, Any]:
        column: dict[str, Any] = {"name": self.name, "type": self.type, "jsonPath": self.json_path}
        if self.description:
            column["description"] = self.description
        if self.priority:
            column["priority"] = self.priority
        return column


@dataclass(frozen=True)
class CRDSpec:
    kind: str
    plural: str
    spec_model: type[BaseModel]
    status_model: type[BaseModel]
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ("strata",)
    printer_columns: tuple[PrinterColumn, ...] = ()
    root_validations: tuple[dict[str, str], ...] = field(default=())
    description: str = ""
    scope: str = "Namespaced"
    """Namespaced, or Cluster for a kind a platform team sets once for the whole cluster (NodeCachePolicy)."""


def _resolve(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[-1]
        merged = {**defs[name], **{k: v for k, v in schema.items() if k != "$ref"}}
        return _resolve(merged, defs)
    return schema


def structural(schema: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    """Inline refs and rewrite pydantic's JSON Schema into the API server's structural subset."""
    schema = _resolve(schema, defs)
    out: dict[str, Any] = {}

    any_of = schema.get("anyOf")
    if any_of is not None:
        branches = [_resolve(b, defs) for b in any_of if b.get("type") != "null"]
        types = {b.get("type") for b in branches}
        if types == {"integer", "string"}:
            out["x-kubernetes-int-or-string"] = True
        elif len(branches) == 1:
            out.update(structural(branches[0], defs))
        else:
            raise ValueError(f"cannot express anyOf {any_of} as a structural schema")

    for key, value in schema.items():
        if key in _DROP_KEYS or key in ("anyOf", "$ref"):
            continue
        if key == "properties":
            out["properties"] = {name: structural(sub, defs) for name, sub in value.items()}
        elif key == "items":
            out["items"] = structural(value, defs)
        elif key == "additionalProperties":
            if isinstance(value, dict) and value:
                out["additionalProperties"] = structural(value, defs)
            elif value is True or value == {}:
                out["x-kubernetes-preserve-unknown-fields"] = True
        elif key == "const":
            out["enum"] = [value]
        elif key == "default" and value is None:
            continue
        else:
            # Copied: pydantic shares one enum list between fields, which YAML would emit as an anchor.
            out[key] = copy.deepcopy(value)
    if out.get("x-kubernetes-preserve-unknown-fields") and "type" not in out:
        out["type"] = "object"
    if "properties" in out:
        out.setdefault("type", "object")
    return out


def model_schema(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return structural(raw, raw.get("$defs", {}))


def build_crd(spec: CRDSpec) -> dict[str, Any]:
    """The full CRD object for one kind, with status subresource and printer columns."""
    root: dict[str, Any] = {
        "type": "object",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": model_schema(spec.spec_model),
            "status": model_schema(spec.status_model),
        },
    }
    if spec.description:
        root["description"] = spec.description
    if spec.root_validations:
        root["x-kubernetes-validations"] = list(spec.root_validations)
    singular = spec.kind.lower()
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{spec.plural}.{GROUP}", "labels": {"app.kubernetes.io/part-of": "strata"}},
        "spec": {
            "group": GROUP,
            "scope": spec.scope,
            "names": {
                "kind": spec.kind,
                "listKind": f"{spec.kind}List",
                "plural": spec.plural,
                "singular": singular,
                "shortNames": list(spec.short_names),
                "categories": list(spec.categories),
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": [c.to_k8s() for c in spec.printer_columns]
                    + [{"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"}],
                    "schema": {"openAPIV3Schema": root},
                }
            ],
        },
    }
