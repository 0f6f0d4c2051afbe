"""Values the CRD's rules refuse, the same rules as the operator's model applies them, and what a spec the API
server accepts but the builders cannot use ends as (a condition, not an exception)."""

from __future__ import annotations

import datetime
import re
from typing import Any

import pytest
from kubernetes.utils.quantity import parse_quantity
from pydantic import ValidationError
from strata_loader import contract
from strata_operator.api import modelcache
from strata_operator.api.base import NON_ZERO_PATTERN
from strata_operator.api.crdgen import build_crd
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.core import invalid_spec, status_patch
from strata_operator.resources.modelcache.draft import Plan
from strata_operator.resources.modelcache.jobs import MODEL_MOUNT, fetch_request
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.observed import Observed
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.plan import plan
from strata_operator.resources.modelcache.status import SpecError
from strata_units import BYTE_SIZE_PATTERN, parse_bytes

WHOLE_BYTES: list[int | str] = [
    "16Mi",
    "1",
    "5Gi",
    "2Ti",
    "500M",
    "1k",
    "3G",
    "1T",
    "016Mi",
    "1024Ki",
    "1Pi",
    "1Ei",
    1,
    16777216,
]
NOT_WHOLE_BYTES: list[int | str] = [
    "1.5Gi",
    "500m",
    "-1",
    -1,
    0,
    "0",
    "0Mi",
    "1K",
    "16MiB",
    "16 Mi",
    "16mi",
    "",
    "1e3",
    "16Mi\n",
    "Mi",
]
SIZE_FIELDS = (("blockSize",), ("memoryLimit",), ("shard", "maxPartBytes"))


def spec_with(preload: dict[str, Any] | None = None, **source: Any) -> dict[str, Any]:
    return {
        "source": {"uri": "s3://models/llama", **source},
        "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "10Gi"}},
        "preload": preload or {},
    }


def preload_schema() -> dict[str, Any]:
    schema = build_crd(modelcache.CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    return dict(schema["properties"]["spec"]["properties"]["preload"])


def with_size(path: tuple[str, ...], value: int | str) -> dict[str, Any]:
    if path == ("shard", "maxPartBytes"):
        return {"shard": {"tensorParallelSize": 2, "maxPartBytes": value}}
    return {path[0]: value}


@pytest.mark.parametrize("value", WHOLE_BYTES, ids=repr)
def test_whole_byte_counts_match_the_pattern_and_mean_the_same_to_kubernetes_and_the_loader(value: int | str) -> None:
    if isinstance(value, str):
        assert re.fullmatch(BYTE_SIZE_PATTERN, value) and re.search(NON_ZERO_PATTERN, value)
        assert parse_bytes(value) == parse_quantity(value)
    for path in SIZE_FIELDS:
        ModelCacheSpec.model_validate(spec_with(with_size(path, value)))


@pytest.mark.parametrize("value", NOT_WHOLE_BYTES, ids=repr)
def test_fractions_milli_negative_and_unknown_units_are_refused(value: int | str) -> None:
    if isinstance(value, str):
        assert not (re.fullmatch(BYTE_SIZE_PATTERN, value) and re.search(NON_ZERO_PATTERN, value))
    for path in SIZE_FIELDS:
        with pytest.raises(ValidationError, match="whole number of bytes"):
            ModelCacheSpec.model_validate(spec_with(with_size(path, value)))


def test_the_crd_carries_the_byte_count_rule_on_every_size() -> None:
    preload = preload_schema()
    for path in SIZE_FIELDS:
        node = preload
        for part in path:
            node = node["properties"][part]
        assert node["x-kubernetes-int-or-string"] is True
        [rule] = node["x-kubernetes-validations"]
        assert node["pattern"] == BYTE_SIZE_PATTERN
        assert BYTE_SIZE_PATTERN in rule["rule"] and "type(self) == int ? self > 0" in rule["rule"]
        assert "1.5Gi" in rule["message"] and "500m" in rule["message"]


def test_a_value_the_loader_refuses_is_a_spec_error_naming_the_field() -> None:
    spec = ModelCacheSpec.model_validate(spec_with(include=["../secrets/*"]))
    with pytest.raises(SpecError) as info:
        fetch_request(spec, MODEL_MOUNT)
    assert info.value.field == "source.include"
    assert str(info.value).startswith("spec.source.include: ") and "'..'" in str(info.value)


NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def body_of(spec: dict[str, Any]) -> dict[str, Any]:
    return {"metadata": {"name": "llama", "namespace": "serving", "uid": "u-1", "generation": 2}, "spec": spec}


def planned(body: dict[str, Any], previous: dict[str, Any], nodes: dict[str, NodeInfo] | None = None) -> Plan:
    """The plan for `body`, observed as gather would observe it (the spec parsed the same way)."""
    observed = Observed(
        owner=CacheRef.from_body(body), previous=previous, now=NOW, nodes=nodes or {}, inputs_checked=True
    )
    try:
        observed.spec = ModelCacheSpec.model_validate(body["spec"])
    except ValidationError as error:
        observed.spec_problem = invalid_spec(error)
    return plan(observed)


def test_a_spec_the_builders_refuse_ends_in_a_condition_and_a_warning() -> None:
    nodes = {"gpu-1": NodeInfo("gpu-1", "node-uid", True, {"pool": "a"})}
    spec = {
        "source": {"uri": "s3://models/llama", "exclude": ["/etc/*"]},
        "storage": {"mode": "NodeLocal", "nodeLocal": {"nodeSelector": {"pool": "a"}}},
    }

    result = planned(body_of(spec), {}, nodes)

    status, events = result.status, result.events
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert status["phase"] == "Failed" and ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert ready["message"].startswith("spec.source.exclude: ") and "is absolute" in ready["message"]
    assert ("Warning", "InvalidSpec", ready["message"]) in events
    assert result.actions == [] and status_patch({}, status) is not None
    again = planned(body_of(spec), status, nodes)
    # settled: no writes, no Events, no retry storm
    assert again.status == status and again.events == [] and again.actions == []
    assert status_patch(status, again.status) is None


def test_a_spec_the_model_refuses_names_the_field_in_the_condition() -> None:
    result = planned(body_of(spec_with({"blockSize": "1.5Gi"})), {})
    status, events = result.status, result.events
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == "InvalidSpec" and ready["message"].startswith("spec.preload.blockSize: '1.5Gi' must be")
    assert "errors.pydantic.dev" not in ready["message"]
    assert any(e[0] == "Warning" and e[1] == "InvalidSpec" for e in events)


@pytest.mark.parametrize(
    ("size", "valid"),
    [("200Gi", True), ("1Pi", True), ("1.5T", False), ("1g", False), ("1K", False), ("500m", False), ("0", False)],
)
def test_a_created_claims_size_uses_the_suffixes_kubernetes_knows(size: str, valid: bool) -> None:
    spec = spec_with()
    spec["storage"]["sharedPVC"]["size"] = size
    if valid:
        ModelCacheSpec.model_validate(spec)
    else:
        with pytest.raises(ValidationError):
            ModelCacheSpec.model_validate(spec)


OPTION_LIKE = [{"revision": "--help"}, {"revision": "-1"}, {"include": ["-rf"]}, {"exclude": ["*.bin", "--all"]}]


@pytest.mark.parametrize("source", OPTION_LIKE, ids=repr)
def test_revisions_and_globs_that_look_like_options_are_refused(source: dict[str, Any]) -> None:
    with pytest.raises(ValidationError, match="must not start with '-'"):
        ModelCacheSpec.model_validate(spec_with(**source))


@pytest.mark.parametrize(
    "source",
    [{"revision": "main", "include": ["[-]*.bin", "*.safetensors"], "exclude": ["original/*"]}, {"revision": "v1-rc"}],
    ids=repr,
)
def test_accepted_revisions_and_globs_survive_the_preloaders_argument_parser(source: dict[str, Any]) -> None:
    request = fetch_request(ModelCacheSpec.model_validate(spec_with(**source)), MODEL_MOUNT)
    assert contract.FetchRequest.parse_args(request.to_args()) == request


def test_the_crd_refuses_leading_dashes_in_revision_and_every_glob() -> None:
    schema = build_crd(modelcache.CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    source = schema["properties"]["spec"]["properties"]["source"]["properties"]
    for node in (source["revision"], source["include"]["items"], source["exclude"]["items"]):
        assert [r["rule"] for r in node["x-kubernetes-validations"]] == ["!self.startsWith('-')"]
        assert node["maxLength"] <= 1024
