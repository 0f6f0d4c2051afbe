"""The ModelCache API models and the CRD generated from them (CEL rules are exercised against the real API
server in the integration tests)."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError
from strata_loader import contract
from strata_operator.api import modelcache
from strata_operator.api.crdgen import build_crd
from strata_operator.api.kinds import render_yaml
from strata_operator.api.modelcache import SOURCE_URI_PATTERN, ModelCacheSpec, StorageMode, VerifyMode


def schema() -> dict:
    return build_crd(modelcache.CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def rules(node: dict) -> list[str]:
    return [r["rule"] for r in node.get("x-kubernetes-validations", [])]


def test_minimal_spec_gets_the_documented_defaults() -> None:
    spec = ModelCacheSpec.model_validate(
        {
            "source": {"uri": "s3://models/llama"},
            "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "10Gi"}},
        }
    )
    assert spec.preload.backoff_limit == 3
    assert spec.preload.verify == VerifyMode.SIZES
    assert spec.mount_path == "/models"
    assert spec.storage.shared_pvc is not None and spec.storage.shared_pvc.access_mode == "ReadWriteMany"


def test_contract_fields_are_the_loader_contract_s_own() -> None:
    """One source: the spec declares the preloader's fields with the loader's own types and grammar."""
    assert VerifyMode is contract.VerifyMode
    for grammar in contract.SOURCE_URI_GRAMMAR.values():
        assert grammar in SOURCE_URI_PATTERN


@pytest.mark.parametrize(
    "uri",
    ["s3://bucket/prefix", "s3://b", "s3://UPPER/x", "hf://org/name", "hf://org/name/x", "hf://o\u0301rg/x",
     "pvc://claim/path", "pvc://claim", "pvc://Claim", "pvc:///x", "s3://bucket/a\nb", "ftp://x/y"],
)  # fmt: skip
def test_the_api_accepts_a_source_uri_exactly_when_the_preloader_does(uri: str) -> None:
    in_api = re.fullmatch(SOURCE_URI_PATTERN.removeprefix("^").removesuffix("$"), uri) is not None
    try:
        contract.FetchRequest(source=uri, dest="/d")
        in_contract = True
    except ValueError:
        in_contract = False
    assert in_api == in_contract


@pytest.mark.parametrize("uri", ["s3://bucket/prefix", "hf://org/name", "pvc://claim/path", "oci://reg/repo:tag"])
def test_supported_source_schemes_parse(uri: str) -> None:
    mode = "ImageVolume" if uri.startswith("oci") else "NodeLocal"
    ModelCacheSpec.model_validate({"source": {"uri": uri}, "storage": {"mode": mode}})


@pytest.mark.parametrize("uri", ["http://example.com/model", "s3://", "hf://justname", "file:///tmp"])
def test_unsupported_sources_are_rejected(uri: str) -> None:
    with pytest.raises(ValidationError):
        ModelCacheSpec.model_validate({"source": {"uri": uri}, "storage": {"mode": "NodeLocal"}})


def test_credentials_are_only_secret_refs_or_service_accounts() -> None:
    credentials = schema()["properties"]["spec"]["properties"]["source"]["properties"]["credentials"]
    assert set(credentials["properties"]) == {"secretRef", "serviceAccountName"}


def test_crd_carries_immutability_and_mode_rules() -> None:
    spec = schema()["properties"]["spec"]
    assert "self == oldSelf" in rules(spec["properties"]["source"]["properties"]["uri"])
    storage = spec["properties"]["storage"]
    assert "self == oldSelf" in rules(storage["properties"]["mode"])
    joined = " ".join(rules(storage))
    for field in ("sharedPVC", "nodeLocal", "imageVolume"):
        assert f"!has(self.{field})" in joined
    assert any("oci://" in r for r in rules(spec))
    assert any("metadata.name.size()" in r for r in rules(schema()))


def test_crd_has_status_subresource_and_useful_columns() -> None:
    version = build_crd(modelcache.CRD)["spec"]["versions"][0]
    assert version["subresources"] == {"status": {}}
    names = [c["name"] for c in version["additionalPrinterColumns"]]
    assert names[:4] == ["Mode", "Phase", "Size", "Ready Nodes"] and names[-1] == "Age"


def test_crd_defaults_preload_so_nested_defaults_apply() -> None:
    preload = schema()["properties"]["spec"]["properties"]["preload"]
    assert preload["default"] == {}
    assert preload["properties"]["backoffLimit"]["default"] == 3


def test_rendered_crd_has_no_yaml_anchors() -> None:
    text = render_yaml(build_crd(modelcache.CRD))
    assert "&id" not in text and "*id" not in text


def test_storage_mode_values() -> None:
    assert [m.value for m in StorageMode] == ["SharedPVC", "NodeLocal", "ImageVolume"]


def test_int_or_string_sizes_keep_their_form_and_reach_the_preloader_as_counts() -> None:
    spec = ModelCacheSpec.model_validate(
        {
            "source": {"uri": "s3://models/llama"},
            "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "200Gi"}},
            "preload": {"blockSize": 8388608, "memoryLimit": "2Gi", "shard": {"tensorParallelSize": 2}},
        }
    )
    preload = spec.to_k8s()["preload"]
    assert preload["blockSize"] == 8388608 and preload["memoryLimit"] == "2Gi"
    assert preload["shard"]["maxPartBytes"] == "5Gi"  # the default, as the CRD writes it
    request = contract.FetchRequest(source="s3://models/llama", dest="/d", block_size=spec.preload.block_size,
                                    memory_limit=spec.preload.memory_limit)  # fmt: skip
    assert request.memory_limit is spec.preload.memory_limit  # not parsed again
    assert "--memory-limit" in request.to_args() and str(2 * 2**30) in request.to_args()
