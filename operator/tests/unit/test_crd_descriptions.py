"""`kubectl explain` shows a field's description and nothing else: every spec and status property of every kind
Strata serves must have one."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from strata_operator.api.crdgen import CRDSpec, build_crd
from strata_operator.api.kinds import KINDS


def properties(node: dict[str, Any], path: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """Every property below `node`, with its path as `kubectl explain` spells it (list items add nothing)."""
    for name, child in (node.get("properties") or {}).items():
        yield f"{path}.{name}", child
        yield from properties(child, f"{path}.{name}")
    for key in ("items", "additionalProperties"):
        if isinstance(node.get(key), dict):
            yield from properties(node[key], path)


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_every_spec_and_status_property_is_described(kind: CRDSpec) -> None:
    schema = build_crd(kind)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    undocumented = [
        path
        for top in ("spec", "status")
        for path, node in [(top, schema["properties"][top]), *properties(schema["properties"][top], top)]
        if not str(node.get("description", "")).strip()
    ]
    assert not undocumented, f"{kind.kind}: no description (add Field(description=...)) on " + ", ".join(undocumented)


def test_the_walk_finds_nested_and_list_properties() -> None:
    schema = {"properties": {"a": {"properties": {"b": {"items": {"properties": {"c": {}}}}}}}}
    assert [path for path, _ in properties(schema, "spec")] == ["spec.a", "spec.a.b", "spec.a.b.c"]
