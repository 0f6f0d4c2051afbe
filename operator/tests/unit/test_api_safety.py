"""Spec values that would point Strata's pods at the node itself: system host paths (mounted writable, removed
from on clean-up) and S3 endpoints on link-local or cloud metadata addresses. Checked here on the models and the
generated rules; the API server runs the same rules in the integration tests."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError
from strata_operator.api import kvcachetier, modelcache
from strata_operator.api.base import (
    LINK_LOCAL_ENDPOINT_PATTERN,
    SYSTEM_DIRECTORY_PATTERN,
    UNCLEAN_SEGMENT_PATTERN,
    cel_string,
)
from strata_operator.api.crdgen import build_crd
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.modelcache.jobs import MODEL_MOUNT, fetch_request, request_hash
from strata_operator.resources.runtime_image import default_runtime

SYSTEM_PATHS = [
    "/",
    "/etc",
    "/bin",
    "/sbin",
    "/usr",
    "/lib",
    "/lib64",
    "/boot",
    "/dev",
    "/proc",
    "/sys",
    "/run",
    "/var/run",
    "/root",
    "/var",
    "/var/lib",
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/lib/docker",
    "/var/lib/etcd",
    "/proc/1/root",
    "/sys/fs/cgroup",
    "/dev/shm",
    "/etc/kubernetes",
    "/boot/efi",
    "/usr/local/models",
    "/var/lib/kubelet/pods",
]
UNCLEAN_PATHS = ["/data/../etc", "/data/..", "/./etc", "/data/.", "/data//models", "//etc", "/data/models/"]
ACCEPTED_PATHS = [
    "/var/lib/strata/models",
    "/var/lib/strata",
    "/mnt/nvme/strata-kv",
    "/data",
    "/opt/models",
    "/etcetera",
    "/usrdata",
    "/variable/lib",
    "/var/lib/kubelet-models",
    "/data/.models/v1",
    "/data/..models",
]


def model_cache(path: str) -> dict[str, Any]:
    return {"source": {"uri": "s3://models/llama"}, "storage": {"mode": "NodeLocal", "nodeLocal": {"path": path}}}


def kv_tier(path: str) -> dict[str, Any]:
    return {"l2": {"fs": {"hostPath": {"path": path}}}}


def path_schemas() -> list[dict[str, Any]]:
    mc = build_crd(modelcache.CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    kv = build_crd(kvcachetier.CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return [
        mc["properties"]["storage"]["properties"]["nodeLocal"]["properties"]["path"],
        kv["properties"]["l2"]["properties"]["fs"]["properties"]["hostPath"]["properties"]["path"],
    ]


@pytest.mark.parametrize("path", SYSTEM_PATHS)
def test_system_directories_and_their_insides_are_refused(path: str) -> None:
    assert re.fullmatch(SYSTEM_DIRECTORY_PATTERN, path)
    with pytest.raises(ValidationError, match="must not be a system directory"):
        ModelCacheSpec.model_validate(model_cache(path))
    with pytest.raises(ValidationError, match="must not be a system directory"):
        KVCacheTierSpec.model_validate(kv_tier(path))


@pytest.mark.parametrize("path", UNCLEAN_PATHS)
def test_dot_segments_double_and_trailing_slashes_are_refused(path: str) -> None:
    with pytest.raises(ValidationError, match="clean absolute path"):
        ModelCacheSpec.model_validate(model_cache(path))
    with pytest.raises(ValidationError, match="clean absolute path"):
        KVCacheTierSpec.model_validate(kv_tier(path))


@pytest.mark.parametrize("path", ACCEPTED_PATHS)
def test_dedicated_directories_are_accepted(path: str) -> None:
    assert not re.fullmatch(SYSTEM_DIRECTORY_PATTERN, path) and not re.search(UNCLEAN_SEGMENT_PATTERN, path)
    ModelCacheSpec.model_validate(model_cache(path))
    KVCacheTierSpec.model_validate(kv_tier(path))


def test_both_host_paths_carry_the_rules_and_document_them() -> None:
    for schema in path_schemas():
        rules = " ".join(r["rule"] for r in schema["x-kubernetes-validations"])
        assert SYSTEM_DIRECTORY_PATTERN in rules and UNCLEAN_SEGMENT_PATTERN in rules
        assert schema["pattern"] == "^/" and schema["maxLength"] == 4096
        assert "Refused: system directories" in schema["description"] and "/var/lib/kubelet" in schema["description"]


METADATA_ENDPOINTS = [
    "http://169.254.169.254",
    "http://169.254.169.254/latest/meta-data/",
    "https://169.254.0.1:9000",
    "http://[fe80::1]:9000",
    "http://[FE80::a9fe:a9fe]",
    "http://[fe80::1%25eth0]/",
    "http://[::ffff:169.254.169.254]",
    "http://[::ffff:a9fe:a9fe]",
    "http://[fd00:ec2::254]",
    "http://metadata.google.internal",
    "http://Metadata.Google.Internal./computeMetadata/v1/",
    "http://metadata.goog",
    "http://instance-data.ec2.internal",
    "http://user:pw@169.254.169.254/",
    "http://a@b@169.254.169.254/",
    "http://169.254.169.254.nip.io",
]
HIDDEN_IPV4_ENDPOINTS = [
    "http://2852039166/",
    "http://0xa9fea9fe",
    "http://0251.0376.0251.0376",
    "http://169.254.43518",
]
STORE_ENDPOINTS = [
    "http://minio.storage.svc:9000",
    "https://s3.us-east-1.amazonaws.com",
    "http://10.0.0.5:9000",
    "http://127.0.0.1:9000",
    "http://[fd00::5]:9000",
    "http://[2001:db8::1]",
    "https://abc.r2.cloudflarestorage.com",
    "http://169.255.1.1",
    "http://metadata.example.com",
]


def cache_s3(endpoint: str, **extra: Any) -> dict[str, Any]:
    return {
        "source": {"uri": "s3://models/llama", "s3": {"endpoint": endpoint, **extra}},
        "storage": {"mode": "NodeLocal"},
    }


def tier_s3(endpoint: str, **extra: Any) -> dict[str, Any]:
    s3 = {"bucket": "kvc", "endpoint": endpoint, "secretRef": {"name": "s3"}, **extra}
    return {"l2": {"s3": s3}}


@pytest.mark.parametrize("endpoint", METADATA_ENDPOINTS)
def test_link_local_and_metadata_endpoints_are_refused_unless_allowed(endpoint: str) -> None:
    with pytest.raises(ValidationError, match=r"source\.s3\.allowLinkLocal: true"):
        ModelCacheSpec.model_validate(cache_s3(endpoint))
    with pytest.raises(ValidationError, match=r"l2\.s3\.allowLinkLocal: true"):
        KVCacheTierSpec.model_validate(tier_s3(endpoint))
    ModelCacheSpec.model_validate(cache_s3(endpoint, allowLinkLocal=True))
    KVCacheTierSpec.model_validate(tier_s3(endpoint, allowLinkLocal=True))


@pytest.mark.parametrize("endpoint", HIDDEN_IPV4_ENDPOINTS)
def test_ipv4_endpoints_must_be_dotted_decimal(endpoint: str) -> None:
    for allow in (False, True):
        with pytest.raises(ValidationError, match="dotted-decimal"):
            ModelCacheSpec.model_validate(cache_s3(endpoint, allowLinkLocal=allow))
        with pytest.raises(ValidationError, match="dotted-decimal"):
            KVCacheTierSpec.model_validate(tier_s3(endpoint, allowLinkLocal=allow))


@pytest.mark.parametrize("endpoint", STORE_ENDPOINTS)
def test_object_store_endpoints_are_accepted(endpoint: str) -> None:
    assert ModelCacheSpec.model_validate(cache_s3(endpoint)).source.s3.allow_link_local is False  # type: ignore[union-attr]
    KVCacheTierSpec.model_validate(tier_s3(endpoint))


def test_both_s3_options_carry_the_endpoint_rules_and_document_the_switch() -> None:
    mc = build_crd(modelcache.CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    kv = build_crd(kvcachetier.CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    for s3 in (mc["properties"]["source"]["properties"]["s3"], kv["properties"]["l2"]["properties"]["s3"]):
        rules = " ".join(r["rule"] for r in s3["x-kubernetes-validations"])
        assert cel_string(LINK_LOCAL_ENDPOINT_PATTERN) in rules and "self.allowLinkLocal" in rules
        switch = s3["properties"]["allowLinkLocal"]
        assert switch["type"] == "boolean" and switch["default"] is False and "metadata" in switch["description"]


def test_allow_link_local_does_not_change_the_preload_job() -> None:
    plain = ModelCacheSpec.model_validate(cache_s3("http://minio:9000"))
    allowed = ModelCacheSpec.model_validate(cache_s3("http://minio:9000", allowLinkLocal=True))
    runtime = default_runtime()
    assert request_hash(plain, fetch_request(plain, MODEL_MOUNT), runtime=runtime) == request_hash(
        allowed, fetch_request(allowed, MODEL_MOUNT), runtime=runtime
    )
