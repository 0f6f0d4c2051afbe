"""The CRD generator turns pydantic models into structural schemas the API server accepts."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field
from strata_operator.api.base import CRDModel, cel
from strata_operator.api.crdgen import CRDSpec, PrinterColumn, build_crd, model_schema
from strata_operator.api.kinds import all_crds


class Inner(CRDModel):
    size: int | str = Field(default="1Gi", description="A quantity.")
    mode: Literal["A", "B"] = "A"


class Outer(CRDModel):
    """An outer spec."""

    inner: Inner = Field(default_factory=Inner)
    maybe_name: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    raw: dict[str, Any] | None = None
    items: list[Inner] = Field(default_factory=list)
    fixed: str = Field(json_schema_extra={"x-kubernetes-validations": [cel("self == oldSelf", "immutable")]})


def _walk(node: Any) -> list[dict[str, Any]]:
    found = []
    if isinstance(node, dict):
        found.append(node)
        for value in node.values():
            found.extend(_walk(value))
    elif isinstance(node, list):
        for value in node:
            found.extend(_walk(value))
    return found


def test_schema_is_structural_without_refs_titles_or_anyof() -> None:
    schema = model_schema(Outer)
    for node in _walk(schema):
        assert "$ref" not in node and "anyOf" not in node and "title" not in node and "$defs" not in node


def test_camel_case_names_and_required_fields() -> None:
    schema = model_schema(Outer)
    assert set(schema["properties"]) == {"inner", "maybeName", "labels", "raw", "items", "fixed"}
    assert schema["required"] == ["fixed"]


def test_int_or_string_and_preserved_objects() -> None:
    schema = model_schema(Outer)
    size = schema["properties"]["inner"]["properties"]["size"]
    assert size["x-kubernetes-int-or-string"] is True and size["default"] == "1Gi"
    assert schema["properties"]["raw"] == {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    assert schema["properties"]["labels"]["additionalProperties"] == {"type": "string"}


def test_enums_and_cel_rules_are_kept() -> None:
    schema = model_schema(Outer)
    assert schema["properties"]["inner"]["properties"]["mode"]["enum"] == ["A", "B"]
    assert schema["properties"]["fixed"]["x-kubernetes-validations"] == [
        {"rule": "self == oldSelf", "message": "immutable"}
    ]
    assert schema["properties"]["items"]["items"]["type"] == "object"


def test_crd_has_status_subresource_printer_columns_and_age() -> None:
    crd = build_crd(
        CRDSpec(
            kind="Thing",
            plural="things",
            spec_model=Outer,
            status_model=Inner,
            printer_columns=(PrinterColumn("Mode", ".spec.inner.mode"),),
        )
    )
    version = crd["spec"]["versions"][0]
    assert crd["metadata"]["name"] == "things.strata.dev"
    assert version["subresources"] == {"status": {}}
    assert [c["name"] for c in version["additionalPrinterColumns"]] == ["Mode", "Age"]
    assert version["schema"]["openAPIV3Schema"]["required"] == ["spec"]


def test_every_strata_crd_renders() -> None:
    names = {crd["metadata"]["name"] for crd in all_crds()}
    assert names == {"modelcaches.strata.dev", "kvcachetiers.strata.dev", "nodecachepolicies.strata.dev"}
    scopes = {crd["metadata"]["name"]: crd["spec"]["scope"] for crd in all_crds()}
    assert scopes["nodecachepolicies.strata.dev"] == "Cluster" and scopes["modelcaches.strata.dev"] == "Namespaced"
