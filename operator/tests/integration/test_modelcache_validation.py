"""Invalid ModelCaches are refused by the API server itself (schema and CEL rules from the CRD), and the
message the user sees says what to fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError
from pydantic import ValidationError
from strata_operator.api import API_VERSION
from strata_operator.api.modelcache import ModelCacheSpec
from strata_testsupport.kube import resource

from .test_modelcache_support import (
    cache_body,
    cache_jobs,
    condition,
    create_cache,
    events_for,
    get_cache,
    unique,
    wait_for_status,
)

pytestmark = pytest.mark.integration

S3 = {"uri": "s3://models/llama"}
INVALID: list[tuple[str, dict[str, Any], str]] = [
    ("shared-without-size", {"source": S3, "storage": {"mode": "SharedPVC"}}, "needs storage.sharedPVC.size"),
    (
        "settings-of-another-mode",
        {"source": S3, "storage": {"mode": "NodeLocal", "sharedPVC": {"size": "1Gi"}}},
        "storage.sharedPVC is only allowed when storage.mode is SharedPVC",
    ),
    (
        "image-volume-from-s3",
        {"source": S3, "storage": {"mode": "ImageVolume"}},
        "ImageVolume needs an oci:// source",
    ),
    ("unknown-scheme", {"source": {"uri": "ftp://x/y"}, "storage": {"mode": "NodeLocal"}}, "spec.source.uri"),
    ("unknown-mode", {"source": S3, "storage": {"mode": "Tape"}}, "Unsupported value"),
    (
        "s3-options-on-hf",
        {"source": {"uri": "hf://org/model", "s3": {"region": "x"}}, "storage": {"mode": "NodeLocal"}},
        "source.s3 is only allowed with an s3:// source",
    ),
]


def message_of(error: DynamicApiError) -> str:
    return str(error.body if hasattr(error, "body") else error)


@pytest.mark.parametrize(("case", "spec", "expected"), INVALID, ids=[c[0] for c in INVALID])
def test_invalid_spec_is_rejected_with_a_clear_message(
    k8s: DynamicClient, strata_crds: Any, namespace: str, case: str, spec: dict[str, Any], expected: str
) -> None:
    with pytest.raises(DynamicApiError) as info:
        create_cache(k8s, namespace, unique(case[:20]), spec)
    assert info.value.status == 422
    assert expected in message_of(info.value)


SIZES = {
    "blockSize": lambda v: {"blockSize": v},
    "memoryLimit": lambda v: {"memoryLimit": v},
    "maxPartBytes": lambda v: {"shard": {"tensorParallelSize": 2, "maxPartBytes": v}},
}


@pytest.mark.parametrize("value", ["1.5Gi", "500m", "-1", -1, 0], ids=repr)
@pytest.mark.parametrize("field", sorted(SIZES))
def test_sizes_must_be_whole_numbers_of_bytes(
    k8s: DynamicClient, strata_crds: Any, namespace: str, field: str, value: Any
) -> None:
    spec = {"source": S3, "storage": {"mode": "NodeLocal"}, "preload": SIZES[field](value)}
    with pytest.raises(DynamicApiError) as info:
        create_cache(k8s, namespace, unique("size"), spec)
    assert info.value.status == 422
    assert field in message_of(info.value) and "whole number of bytes" in message_of(info.value)


@pytest.mark.parametrize("size", ["1.5Ti", "500m", "0"])
def test_a_created_claims_size_must_be_whole_bytes(
    k8s: DynamicClient, strata_crds: Any, namespace: str, size: str
) -> None:
    spec = {"source": S3, "storage": {"mode": "SharedPVC", "sharedPVC": {"size": size}}}
    with pytest.raises(DynamicApiError) as info:
        create_cache(k8s, namespace, unique("pvc"), spec)
    assert info.value.status == 422
    assert "spec.storage.sharedPVC.size" in message_of(info.value)


@pytest.mark.parametrize("value", ["16Mi", "500M", 1048576])
def test_whole_byte_counts_are_accepted(k8s: DynamicClient, strata_crds: Any, namespace: str, value: Any) -> None:
    preload = {name: make(value) for name, make in SIZES.items()}
    spec = {
        "source": S3,
        "storage": {"mode": "NodeLocal"},
        "preload": {k: v for p in preload.values() for k, v in p.items()},
    }
    create_cache(k8s, namespace, unique("size"), spec)


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/", "must not be a system directory"),
        ("/etc", "must not be a system directory"),
        ("/var/lib/kubelet", "must not be a system directory"),
        ("/proc/1/root", "must not be a system directory"),
        ("/var/lib", "must not be a system directory"),
        ("/data/../etc", "clean absolute path"),
        ("/data//models", "clean absolute path"),
        ("/data/models/", "clean absolute path"),
    ],
)
def test_node_local_paths_on_system_directories_are_rejected(
    k8s: DynamicClient, strata_crds: Any, namespace: str, path: str, expected: str
) -> None:
    spec = {"source": S3, "storage": {"mode": "NodeLocal", "nodeLocal": {"path": path}}}
    with pytest.raises(DynamicApiError) as info:
        create_cache(k8s, namespace, unique("path"), spec)
    assert info.value.status == 422
    assert "spec.storage.nodeLocal.path" in message_of(info.value) and expected in message_of(info.value)


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [
        ("http://169.254.169.254/latest/meta-data/", "link-local or cloud metadata address"),
        ("http://[fe80::1]:9000", "link-local or cloud metadata address"),
        ("http://[::ffff:169.254.169.254]", "link-local or cloud metadata address"),
        ("http://Metadata.Google.Internal", "link-local or cloud metadata address"),
        ("http://2852039166", "dotted-decimal"),
    ],
)
def test_s3_endpoints_on_metadata_addresses_are_rejected(
    k8s: DynamicClient, strata_crds: Any, namespace: str, endpoint: str, expected: str
) -> None:
    spec = {"source": {**S3, "s3": {"endpoint": endpoint}}, "storage": {"mode": "NodeLocal"}}
    with pytest.raises(DynamicApiError) as info:
        create_cache(k8s, namespace, unique("s3"), spec)
    assert info.value.status == 422
    assert "spec.source.s3.endpoint" in message_of(info.value) and expected in message_of(info.value)


ENDPOINTS = [
    "http://169.254.169.254",
    "http://[fe80::1%25eth0]/",
    "http://[FE80::a9fe:a9fe]",
    "http://[::ffff:a9fe:a9fe]",
    "http://[fd00:ec2::254]",
    "http://user:pw@169.254.169.254/",
    "http://169.254.169.254.nip.io",
    "http://metadata.goog",
    "http://instance-data.ec2.internal:80",
    "http://0xa9fea9fe",
    "http://0251.0376.0251.0376",
    "http://169.254.43518",
    "http://minio.storage.svc:9000",
    "http://10.0.0.5:9000",
    "http://[2001:db8::1]",
    "http://169.255.1.1",
    "http://metadata.example.com",
]


def test_the_api_server_and_the_model_agree_on_endpoints(k8s: DynamicClient, strata_crds: Any, namespace: str) -> None:
    """The CEL rules and the model's check run the same regexes on two engines (RE2 and Python's re)."""
    caches = resource(k8s, API_VERSION, "ModelCache")
    for endpoint in ENDPOINTS:
        spec = {"source": {**S3, "s3": {"endpoint": endpoint}}, "storage": {"mode": "NodeLocal"}}
        try:
            ModelCacheSpec.model_validate(spec)
            model_accepts = True
        except ValidationError:
            model_accepts = False
        try:
            caches.create(body=cache_body(unique("s3"), spec), namespace=namespace, dry_run="All")
            server_accepts = True
        except DynamicApiError:
            server_accepts = False
        assert server_accepts == model_accepts, endpoint


def test_a_link_local_endpoint_is_accepted_when_explicitly_allowed(
    k8s: DynamicClient, strata_crds: Any, namespace: str
) -> None:
    s3 = {"endpoint": "http://169.254.10.20:9000", "allowLinkLocal": True}
    created = create_cache(k8s, namespace, unique("s3"), {"source": {**S3, "s3": s3}, "storage": {"mode": "NodeLocal"}})
    assert created.to_dict()["spec"]["source"]["s3"]["allowLinkLocal"] is True
    plain = create_cache(
        k8s,
        namespace,
        unique("s3"),
        {"source": {**S3, "s3": {"endpoint": "http://minio:9000"}}, "storage": {"mode": "NodeLocal"}},
    )
    assert plain.to_dict()["spec"]["source"]["s3"]["allowLinkLocal"] is False


@pytest.mark.parametrize(
    ("source", "field"),
    [
        ({"revision": "--help"}, "spec.source.revision"),
        ({"include": ["*.json", "-rf"]}, "spec.source.include[1]"),
        ({"exclude": ["--all"]}, "spec.source.exclude[0]"),
    ],
)
def test_revisions_and_globs_starting_with_a_dash_are_rejected(
    k8s: DynamicClient, strata_crds: Any, namespace: str, source: dict[str, Any], field: str
) -> None:
    with pytest.raises(DynamicApiError) as info:
        create_cache(k8s, namespace, unique("dash"), {"source": {**S3, **source}, "storage": {"mode": "NodeLocal"}})
    assert info.value.status == 422
    assert field in message_of(info.value) and "must not start with '-'" in message_of(info.value)


def test_a_spec_the_preloader_would_refuse_ends_in_a_condition(
    k8s: DynamicClient, operator: Any, namespace: str
) -> None:
    """The CRD lets `..` globs through; the loader's contract refuses them while the Job is built. That must end
    as InvalidSpec with the field named and a Warning, not as an exception retried with backoff forever."""
    name = unique("glob")
    spec = {
        "source": {**S3, "include": ["../other-model/*"]},
        "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}},
    }
    create_cache(k8s, namespace, name, spec)
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Failed", "phase Failed")
    cache = get_cache(k8s, namespace, name)
    ready, degraded = condition(cache, "Ready"), condition(cache, "Degraded")
    assert ready["status"] == "False" and ready["reason"] == "InvalidSpec"
    assert degraded["status"] == "True" and degraded["message"].startswith("spec.source.include: ")
    assert cache_jobs(k8s, namespace, name) == []
    events = events_for(k8s, namespace, name)
    assert any(e["type"] == "Warning" and e["reason"] == "InvalidSpec" for e in events)
    assert not any(e["reason"] == "ReconcileError" for e in events)


def test_source_uri_and_mode_are_immutable(k8s: DynamicClient, strata_crds: Any, namespace: str) -> None:
    name = unique("immutable")
    create_cache(k8s, namespace, name, {"source": S3, "storage": {"mode": "NodeLocal"}})
    caches = resource(k8s, API_VERSION, "ModelCache")
    for patch, expected in (
        ({"spec": {"source": {"uri": "s3://models/other"}}}, "source.uri is immutable"),
        ({"spec": {"storage": {"mode": "ImageVolume"}}}, "storage.mode is immutable"),
    ):
        with pytest.raises(DynamicApiError) as info:
            caches.patch(name=name, namespace=namespace, body=patch, content_type="application/merge-patch+json")
        assert expected in message_of(info.value)


def test_names_longer_than_a_label_value_are_rejected(k8s: DynamicClient, strata_crds: Any, namespace: str) -> None:
    with pytest.raises(DynamicApiError) as info:
        resource(k8s, API_VERSION, "ModelCache").create(
            body=cache_body("m" * 70, {"source": S3, "storage": {"mode": "NodeLocal"}}), namespace=namespace
        )
    assert "at most 63 characters" in message_of(info.value)


def test_defaults_are_filled_in_by_the_api_server(k8s: DynamicClient, strata_crds: Any, namespace: str) -> None:
    name = unique("defaults")
    created = create_cache(k8s, namespace, name, {"source": S3, "storage": {"mode": "NodeLocal"}}).to_dict()
    assert created["spec"]["preload"]["backoffLimit"] == 3
    assert created["spec"]["mountPath"] == "/models" and created["spec"]["deletionPolicy"] == "Delete"


SAMPLES = sorted((Path(__file__).resolve().parents[3] / "samples").glob("modelcache-*.yaml"))


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_samples_are_accepted_by_the_api_server(
    k8s: DynamicClient, strata_crds: Any, namespace: str, path: Path
) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        if doc and doc["kind"] == "ModelCache":
            resource(k8s, API_VERSION, "ModelCache").create(body=doc, namespace=namespace, dry_run="All")
