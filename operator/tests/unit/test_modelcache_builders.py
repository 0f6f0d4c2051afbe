"""Pure builders: names, Jobs, claims and the volume snippet, asserted on the objects they return."""

from __future__ import annotations

import re
from typing import Any

import pytest
from strata_loader.contract import FetchRequest
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.modelcache import names, storage
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.plan import MODES
from strata_operator.resources.modelcache.volume import volume_name

OWNER = CacheRef(name="llama", namespace="serving", uid="uid-1", generation=1)
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def spec_for(mode: str, **extra: Any) -> ModelCacheSpec:
    storage_spec: dict[str, Any] = {"mode": mode}
    uri = "oci://registry.example/models/llama:1" if mode == "ImageVolume" else "s3://models/llama"
    if mode == "SharedPVC":
        storage_spec["sharedPVC"] = {"size": "100Gi", "storageClassName": "fast-rwx"}
    source = {"uri": uri, **extra.pop("source", {})}
    return ModelCacheSpec.model_validate({"source": source, "storage": storage_spec, **extra})


def container(job: dict[str, Any]) -> dict[str, Any]:
    return job["spec"]["template"]["spec"]["containers"][0]


def test_long_names_are_bounded_and_stay_distinct() -> None:
    a = names.bounded_name("x" * 70, "preload", "abc")
    b = names.bounded_name("x" * 70, "preload", "abd")
    assert len(a) <= 63 and len(b) <= 63 and a != b
    assert names.bounded_name("short", "preload", "abc") == "short-preload-abc"


def test_node_label_key_fits_the_label_limit_and_names_the_namespace() -> None:
    assert names.node_label_key("serving", "llama") == "strata.dev/model.serving.llama"
    long_key = names.node_label_key("n" * 60, "m" * 63)
    name_part = long_key.split("/", 1)[1]
    assert len(name_part) <= 63 and name_part.startswith("model.")
    assert long_key != names.node_label_key("n" * 60, "m" * 62)


def test_preload_job_runs_the_contract_arguments() -> None:
    spec = spec_for("SharedPVC", source={"revision": "main", "include": ["*.safetensors"]})
    _, job = storage.shared_pvc_preload(OWNER, spec, "claim-uid")
    c = container(job)
    assert c["command"] == ["strata-loader"]
    request = FetchRequest.parse_args(c["args"])
    assert (request.source, request.dest, request.revision) == ("s3://models/llama", "/strata/model", "main")
    assert request.include == ["*.safetensors"]
    assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"


def test_jobs_meet_the_restricted_pod_security_standard() -> None:
    _, job = storage.shared_pvc_preload(OWNER, spec_for("SharedPVC"), "claim-uid")
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    sc = container(job)["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert pod["automountServiceAccountToken"] is False
    assert {"name": "tmp", "mountPath": "/tmp"} in container(job)["volumeMounts"]


def test_job_limits_come_from_the_spec() -> None:
    spec = spec_for("SharedPVC", preload={"backoffLimit": 1, "ttlSecondsAfterFinished": 60})
    _, job = storage.shared_pvc_preload(OWNER, spec, "claim-uid")
    assert job["spec"]["backoffLimit"] == 1 and job["spec"]["ttlSecondsAfterFinished"] == 60
    assert container(job)["resources"]["limits"]["memory"] == "4Gi"


def test_job_is_owned_and_labelled() -> None:
    _, job = storage.shared_pvc_preload(OWNER, spec_for("SharedPVC"), "claim-uid")
    meta = job["metadata"]
    assert meta["ownerReferences"][0]["uid"] == "uid-1" and meta["ownerReferences"][0]["controller"] is True
    assert meta["labels"]["app.kubernetes.io/managed-by"] == "strata"
    assert meta["labels"][names.CACHE_LABEL] == "llama"
    assert job["spec"]["template"]["metadata"]["labels"][names.CACHE_LABEL] == "llama"
    assert len(meta["name"]) <= 63 and DNS_LABEL.match(meta["name"])


def test_credentials_come_from_the_secret_and_service_account() -> None:
    spec = spec_for(
        "SharedPVC",
        source={
            "credentials": {"secretRef": {"name": "s3-creds"}, "serviceAccountName": "loader"},
            "s3": {"endpoint": "http://minio:9000", "region": "eu-west-1"},
        },
    )
    _, job = storage.shared_pvc_preload(OWNER, spec, "claim-uid")
    c = container(job)
    assert c["envFrom"] == [{"secretRef": {"name": "s3-creds"}}]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["AWS_ENDPOINT_URL"] == "http://minio:9000" and env["AWS_REGION"] == "eu-west-1"
    assert not any("SECRET" in name for name in env)
    assert job["spec"]["template"]["spec"]["serviceAccountName"] == "loader"


def test_a_changed_fetch_request_gets_a_new_job_and_an_unrelated_change_does_not() -> None:
    base, _ = storage.shared_pvc_preload(OWNER, spec_for("SharedPVC"), "uid")
    revision, _ = storage.shared_pvc_preload(OWNER, spec_for("SharedPVC", source={"revision": "v2"}), "uid")
    include, _ = storage.shared_pvc_preload(OWNER, spec_for("SharedPVC", source={"include": ["*.json"]}), "uid")
    new_claim, _ = storage.shared_pvc_preload(OWNER, spec_for("SharedPVC"), "other-uid")
    mount, _ = storage.shared_pvc_preload(OWNER, spec_for("SharedPVC", mountPath="/weights"), "uid")
    assert len({base, revision, include, new_claim}) == 4
    assert mount == base


def test_pvc_source_is_mounted_read_only_where_the_loader_looks() -> None:
    spec = spec_for("NodeLocal", source={"uri": "pvc://weights/llama"})
    _, job = storage.node_preload(OWNER, spec, "node-a", "node-uid")
    mounts = {m["name"]: m for m in container(job)["volumeMounts"]}
    assert mounts["source"] == {"name": "source", "mountPath": "/strata/source/weights", "readOnly": True}


def test_created_claim_is_rwx_sized_and_owned_only_when_deleted_with_the_cache() -> None:
    claim = storage.build_claim(OWNER, spec_for("SharedPVC"))
    assert claim["metadata"]["name"] == "llama-model"
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "100Gi"
    assert claim["spec"]["storageClassName"] == "fast-rwx"
    assert "ownerReferences" in claim["metadata"]
    kept = storage.build_claim(OWNER, spec_for("SharedPVC", deletionPolicy="Retain"))
    assert "ownerReferences" not in kept["metadata"]


def test_adopted_claim_is_used_by_name() -> None:
    spec = ModelCacheSpec.model_validate(
        {"source": {"uri": "s3://models/x"}, "storage": {"mode": "SharedPVC", "sharedPVC": {"claimName": "mine"}}}
    )
    assert storage.claim_is_adopted(spec) and storage.claim_name(OWNER, spec) == "mine"
    with pytest.raises(ValueError, match="size"):
        storage.build_claim(OWNER, spec)


def test_node_preload_is_pinned_and_writes_below_the_node_root() -> None:
    spec = spec_for("NodeLocal")
    _, job = storage.node_preload(OWNER, spec, "gpu-node-1", "uid-n1")
    pod = job["spec"]["template"]["spec"]
    term = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term["matchFields"] == [{"key": "metadata.name", "operator": "In", "values": ["gpu-node-1"]}]
    assert FetchRequest.parse_args(container(job)["args"]).dest == "/strata/node/serving/llama"
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["node-root"]["hostPath"] == {"path": "/var/lib/strata/models", "type": "Directory"}
    other, _ = storage.node_preload(OWNER, spec, "gpu-node-1", "uid-recreated")
    assert other != storage.node_preload(OWNER, spec, "gpu-node-1", "uid-n1")[0]


def test_cleanup_job_outlives_the_cache_and_removes_only_its_copy() -> None:
    job = storage.node_cleanup(OWNER, spec_for("NodeLocal"), "gpu-node-1")
    assert "ownerReferences" not in job["metadata"]
    assert container(job)["args"] == ["rm -rf -- '/strata/node/serving/llama'"]


def test_prepull_job_mounts_the_image_volume() -> None:
    _, job = storage.node_prepull(OWNER, spec_for("ImageVolume"), "gpu-node-1", "uid")
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["model"]["image"] == {
        "reference": "registry.example/models/llama:1",
        "pullPolicy": "IfNotPresent",
    }


def build_volume_snippet(owner: CacheRef, spec: ModelCacheSpec) -> dict[str, Any]:
    return MODES[spec.storage.mode].volume(owner, spec)


def test_volume_snippet_per_mode() -> None:
    shared = build_volume_snippet(OWNER, spec_for("SharedPVC"))
    assert shared["volume"] == {
        "name": "model-llama",
        "persistentVolumeClaim": {"claimName": "llama-model", "readOnly": True},
    }
    assert shared["volumeMount"] == {"name": "model-llama", "mountPath": "/models", "readOnly": True}
    local = build_volume_snippet(OWNER, spec_for("NodeLocal"))
    assert local["volume"]["hostPath"]["path"] == "/var/lib/strata/models/serving/llama"
    assert local["nodeSelector"] == {"strata.dev/model.serving.llama": "Ready"}
    image = build_volume_snippet(OWNER, spec_for("ImageVolume"))
    assert image["volume"]["image"]["reference"] == "registry.example/models/llama:1"


@pytest.mark.parametrize(
    "cache_name",
    [
        "llama",
        "llama-3.1-8b",
        "org.team.llama",
        "a.b",
        "a" * 63,
        "x" * 57,
        "x" * 58,
        ("llama.3." * 8)[:63].rstrip("."),
        "a" + ".b" * 31,
        "0.1",
    ],
)
def test_the_volume_name_is_a_dns_label_for_every_valid_cache_name(cache_name: str) -> None:
    snippet = build_volume_snippet(CacheRef(cache_name, "serving", "uid-1"), spec_for("SharedPVC"))
    name = snippet["volume"]["name"]
    assert DNS_LABEL.match(name) and len(name) <= 63, name
    assert snippet["volumeMount"]["name"] == name


def test_volume_names_stay_as_they_were_for_plain_names_and_distinct_for_dotted_ones() -> None:
    assert volume_name(CacheRef("llama", "serving", "u")) == "model-llama"
    assert volume_name(CacheRef("a" * 63, "serving", "u")) == names.bounded_name("model", "a" * 63)
    cache_names = ["a.b", "a-b", "a.b.c", "a-b.c", "a.b-c", "a-b-c", "m" * 62 + "x", "m" * 62 + "y", "m.m" + "m" * 60]
    assert len({volume_name(CacheRef(n, "serving", "u")) for n in cache_names}) == len(cache_names)
