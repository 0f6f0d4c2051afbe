"""The KVCacheTier API: defaults, enums, CEL rules and printer columns as the generated CRD carries them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import ValidationError
from strata_kv.config import EvictionPolicyName, ListenConfig
from strata_operator.api.crdgen import build_crd
from strata_operator.api.kvcachetier import CRD, EvictionPolicy, KVCacheTierSpec


def _schema() -> dict[str, Any]:
    return build_crd(CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]


def _rules(node: dict[str, Any]) -> list[str]:
    return [r["rule"] for r in node.get("x-kubernetes-validations", [])]


def test_empty_spec_gets_every_default() -> None:
    spec = KVCacheTierSpec.model_validate({})
    assert spec.l1.size == 4 * 2**30 and spec.l1.size.spelling == "4Gi"
    assert spec.l1.eviction_policy is EvictionPolicy.PREFIX_LIRS
    assert spec.chunk_tokens == 256
    assert spec.port == 6379 and spec.metrics_port == 9121
    assert spec.hash.algorithm == "sha256_cbor"


def test_nested_objects_default_to_empty_so_the_api_server_fills_their_fields() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    for name in ("l1", "hash", "tenancy", "updateStrategy"):
        assert spec[name]["default"] == {}, name
    assert spec["l1"]["properties"]["size"]["default"] == "4Gi"


def test_fields_the_server_reads_are_declared_by_the_server_s_config() -> None:
    """One source: the spec takes the server's own enums and bounds, so the two cannot drift."""
    assert EvictionPolicy is EvictionPolicyName
    threads = _schema()["properties"]["spec"]["properties"]["senderThreads"]
    assert (threads["minimum"], threads["maximum"], threads["default"]) == (0, 64, ListenConfig().sender_threads)
    assert str(ListenConfig.model_fields["sender_threads"].description) in threads["description"]
    with pytest.raises(ValidationError):
        KVCacheTierSpec(sender_threads=65)


def test_cel_rules_guard_the_l2_choices() -> None:
    l2 = _schema()["properties"]["spec"]["properties"]["l2"]
    assert "has(self.fs) || has(self.s3)" in _rules(l2)
    fs = l2["properties"]["fs"]
    assert "has(self.pvc) != has(self.hostPath)" in _rules(fs)
    assert "self.lowWatermarkPercent < self.highWatermarkPercent" in _rules(fs)
    assert "has(self.claimName) != has(self.create)" in _rules(fs["properties"]["pvc"])
    assert "!has(self.endpoint) || has(self.secretRef)" in _rules(l2["properties"]["s3"])


def test_embedded_kubernetes_objects_keep_unknown_fields() -> None:
    spec = _schema()["properties"]["spec"]["properties"]
    assert spec["affinity"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["resources"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["tolerations"]["items"]["x-kubernetes-preserve-unknown-fields"] is True
    assert spec["updateStrategy"]["properties"]["maxUnavailable"]["x-kubernetes-int-or-string"] is True


def test_printer_columns_show_instances_l1_and_l2() -> None:
    columns = build_crd(CRD)["spec"]["versions"][0]["additionalPrinterColumns"]
    names = [c["name"] for c in columns]
    assert names[:4] == ["Ready", "Desired", "L1", "L2"]
    assert names[-1] == "Age"


def test_status_is_a_subresource() -> None:
    assert build_crd(CRD)["spec"]["versions"][0]["subresources"] == {"status": {}}


@pytest.mark.parametrize(
    "spec",
    [
        {"l1": {"size": "lots"}},
        {"l1": {"evictionPolicy": "random"}},
        {"hash": {"algorithm": "md5"}},
        {"hash": {"seed": "abc"}},
        {"chunkTokens": 0},
        {"senderThreads": -1},
        {"senderThreads": 65},
        {"unknownField": 1},
    ],
)
def test_bad_specs_are_refused_by_the_model(spec: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        KVCacheTierSpec.model_validate(spec)


def test_samples_are_valid_specs() -> None:
    samples = sorted((Path(__file__).resolve().parents[3] / "samples").glob("kvcachetier-*.yaml"))
    assert samples
    for path in samples:
        tiers = [d for d in yaml.safe_load_all(path.read_text()) if d and d["kind"] == "KVCacheTier"]
        assert tiers, path
        for doc in tiers:
            KVCacheTierSpec.model_validate(doc["spec"])


def test_require_salt_needs_the_lmcache_connector() -> None:
    """The server's salt check reads LMCache's key format; vLLM's keys carry no salt (it is in the hashes)."""
    spec = _schema()["properties"]["spec"]
    assert any("self.tenancy.requireSalt" in rule and "self.connector.type == 'vllm'" in rule for rule in _rules(spec))
    with pytest.raises(ValidationError, match=r"set connector\.type lmcache, or requireSalt false"):
        KVCacheTierSpec.model_validate({"tenancy": {"requireSalt": True}})
    KVCacheTierSpec.model_validate({"tenancy": {"requireSalt": True}, "connector": {"type": "lmcache"}})


def test_sizes_are_parsed_once_and_written_back_as_the_user_wrote_them() -> None:
    written = {
        "l1": {"size": "1500M"},
        "memoryHeadroom": "0512Mi",
        "l2": {"fs": {"hostPath": {"path": "/mnt/nvme/kv"}, "capacity": "2Ti"}},
        "connector": {"cpuBytes": "8Gi"},
        "clientShmSize": "9Gi",
    }
    spec = KVCacheTierSpec.model_validate(written)
    assert (spec.l1.size, spec.memory_headroom, spec.connector.cpu_bytes) == (1_500_000_000, 512 * 2**20, 8 * 2**30)
    again = spec.to_k8s()
    assert again["l1"]["size"] == "1500M" and again["memoryHeadroom"] == "0512Mi"
    assert again["l2"]["fs"]["capacity"] == "2Ti" and again["clientShmSize"] == "9Gi"
    assert KVCacheTierSpec.model_validate(again) == spec
