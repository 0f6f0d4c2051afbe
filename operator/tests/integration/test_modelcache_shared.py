"""SharedPVC end to end on the real control plane: claim, preloader Job, result read back, drift and changes."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from strata_operator.api import API_VERSION
from strata_testsupport.kube import delete_and_collect, get_or_none, resource, wait_for

from .test_modelcache_support import (
    ReconcilePasses,
    cache_jobs,
    condition,
    create_cache,
    events_for,
    fetch_result,
    finish_job,
    get_cache,
    unique,
    wait_for_status,
)

pytestmark = pytest.mark.integration


def shared_spec(**storage: Any) -> dict[str, Any]:
    return {
        "source": {"uri": "s3://models/llama-3-8b", "revision": "main"},
        "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "20Gi", **storage}},
    }


def test_shared_pvc_cache_becomes_ready_from_the_preloader_result(
    k8s: DynamicClient, operator: Any, namespace: str
) -> None:
    name = unique("llama")
    create_cache(k8s, namespace, name, shared_spec())
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("job"), "a preloader Job in status")
    claim = resource(k8s, "v1", "PersistentVolumeClaim").get(name=f"{name}-model", namespace=namespace).to_dict()
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]
    assert claim["metadata"]["ownerReferences"][0]["name"] == name
    job = resource(k8s, "batch/v1", "Job").get(name=status["job"], namespace=namespace).to_dict()
    assert job["spec"]["template"]["spec"]["containers"][0]["args"][:2] == ["fetch", "s3://models/llama-3-8b"]
    assert (
        status["phase"] == "Preloading"
        and condition(get_cache(k8s, namespace, name), "Reconciling")["status"] == "True"
    )

    finish_job(k8s, namespace, status["job"], fetch_result("s3://models/llama-3-8b", revision="main"))
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "phase Ready")
    assert status["totalBytes"] == 5 * 2**30 and status["totalFiles"] == 7 and status["size"] == "5.0GiB"
    assert status["resolvedRevision"] == "main"
    assert status["volume"]["volume"]["persistentVolumeClaim"] == {"claimName": f"{name}-model", "readOnly": True}
    ready = condition(get_cache(k8s, namespace, name), "Ready")
    assert ready["status"] == "True" and ready["observedGeneration"] == 1
    reasons = {e["reason"] for e in events_for(k8s, namespace, name)}
    assert {"ClaimCreated", "PreloadStarted", "Preloaded"} <= reasons


def ready_cache(k8s: DynamicClient, namespace: str, spec: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    name = unique("mc")
    create_cache(k8s, namespace, name, spec)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("job"), "a preloader Job")
    finish_job(
        k8s, namespace, status["job"], fetch_result(spec["source"]["uri"], revision=spec["source"].get("revision"))
    )
    return name, wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "phase Ready")


def test_a_revision_change_starts_a_new_preload(k8s: DynamicClient, operator: Any, namespace: str) -> None:
    name, first = ready_cache(k8s, namespace, shared_spec())
    patch = {"spec": {"source": {"revision": "v2"}}}
    resource(k8s, API_VERSION, "ModelCache").patch(
        name=name, namespace=namespace, body=patch, content_type="application/merge-patch+json"
    )
    second = wait_for_status(k8s, namespace, name, lambda s: s.get("job") != first["job"], "a new Job")
    assert second["phase"] == "Preloading" and second["observedGeneration"] == 2
    wait_for(
        lambda: (
            not cache_jobs(k8s, namespace, name)
            or all(j["metadata"]["name"] == second["job"] for j in cache_jobs(k8s, namespace, name))
        ),
        what="the superseded Job deleted",
    )
    finish_job(k8s, namespace, second["job"], fetch_result("s3://models/llama-3-8b", revision="v2"))
    done = wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "Ready on v2")
    assert done["resolvedRevision"] == "v2"


def test_a_deleted_claim_is_recreated_and_refilled(k8s: DynamicClient, operator: Any, namespace: str) -> None:
    name, first = ready_cache(k8s, namespace, shared_spec())
    claims = resource(k8s, "v1", "PersistentVolumeClaim")
    old_uid = claims.get(name=f"{name}-model", namespace=namespace).metadata.uid
    claims.delete(name=f"{name}-model", namespace=namespace)

    def recreated() -> bool:
        claim = claims.get(name=f"{name}-model", namespace=namespace)
        return claim.metadata.uid != old_uid and not claim.metadata.deletionTimestamp

    wait_for(recreated, what="the claim recreated")
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("job") not in (None, first["job"]), "a new Job")
    assert status["phase"] == "Preloading"


def test_nothing_is_written_when_nothing_changed(
    k8s: DynamicClient, operator: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name, status = ready_cache(k8s, namespace, shared_spec())
    caches = resource(k8s, API_VERSION, "ModelCache")
    before = caches.get(name=name, namespace=namespace).metadata.resourceVersion
    claim_before = resource(k8s, "v1", "PersistentVolumeClaim").get(name=f"{name}-model", namespace=namespace)
    events_before = len(events_for(k8s, namespace, name))
    jobs = resource(k8s, "batch/v1", "Job")

    def touched() -> bool:
        annotations = jobs.get(name=status["job"], namespace=namespace).metadata.annotations or {}
        return annotations.get("touched") == "yes"

    passes = ReconcilePasses(monkeypatch, namespace, name, visible=touched)
    # Touching a child wakes the reconcile; it must find nothing to do.
    jobs.patch(
        name=status["job"],
        namespace=namespace,
        body={"metadata": {"annotations": {"touched": "yes"}}},
        content_type="application/merge-patch+json",
    )
    assert passes.wait() == []  # a pass that read the touched Job has finished, and posted no Event
    assert caches.get(name=name, namespace=namespace).metadata.resourceVersion == before
    claim_after = resource(k8s, "v1", "PersistentVolumeClaim").get(name=f"{name}-model", namespace=namespace)
    assert claim_after.metadata.resourceVersion == claim_before.metadata.resourceVersion
    assert len(events_for(k8s, namespace, name)) == events_before


def test_a_failed_preload_says_why(k8s: DynamicClient, operator: Any, namespace: str) -> None:
    name = unique("mc")
    spec = shared_spec()
    spec["preload"] = {"backoffLimit": 0}
    create_cache(k8s, namespace, name, spec)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("job"), "a preloader Job")
    error = "AccessDenied: s3://models/llama-3-8b is not readable with the given credentials"
    result = fetch_result("s3://models/llama-3-8b", status="Failed", error=error, files=0, bytes=0)
    finish_job(k8s, namespace, status["job"], result, succeeded=False)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Failed", "phase Failed")
    degraded = condition(get_cache(k8s, namespace, name), "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "PreloadFailed"
    assert "AccessDenied" in degraded["message"]
    warnings = [e for e in events_for(k8s, namespace, name) if e["type"] == "Warning"]
    assert any(e["reason"] == "PreloadFailed" and "AccessDenied" in e["message"] for e in warnings)


def test_a_missing_secret_is_reported_and_no_job_is_made(k8s: DynamicClient, operator: Any, namespace: str) -> None:
    name = unique("mc")
    spec = shared_spec()
    spec["source"]["credentials"] = {"secretRef": {"name": "no-such-secret"}}
    create_cache(k8s, namespace, name, spec)
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Failed", "phase Failed")
    degraded = condition(get_cache(k8s, namespace, name), "Degraded")
    assert degraded["reason"] == "SecretNotFound" and "no-such-secret" in degraded["message"]
    assert cache_jobs(k8s, namespace, name) == []
    assert any(e["reason"] == "SecretNotFound" for e in events_for(k8s, namespace, name))


def test_a_missing_storage_class_is_reported(k8s: DynamicClient, operator: Any, namespace: str) -> None:
    name = unique("mc")
    create_cache(k8s, namespace, name, shared_spec(storageClassName="no-such-class"))
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Failed", "phase Failed")
    degraded = condition(get_cache(k8s, namespace, name), "Degraded")
    assert degraded["reason"] == "StorageClassNotFound" and "no-such-class" in degraded["message"]


def test_retain_policy_keeps_the_claim(k8s: DynamicClient, operator: Any, namespace: str) -> None:
    name, _ = ready_cache(k8s, namespace, shared_spec())
    claims = resource(k8s, "v1", "PersistentVolumeClaim")
    caches = resource(k8s, API_VERSION, "ModelCache")
    caches.patch(
        name=name,
        namespace=namespace,
        body={"spec": {"deletionPolicy": "Retain"}},
        content_type="application/merge-patch+json",
    )
    wait_for(
        lambda: not claims.get(name=f"{name}-model", namespace=namespace).metadata.ownerReferences,
        what="the claim released from the cache",
    )
    delete_and_collect(k8s, API_VERSION, "ModelCache", name, namespace)  # the garbage collector is done with it
    assert claims.get(name=f"{name}-model", namespace=namespace).metadata.deletionTimestamp is None


def test_a_dotted_cache_name_gives_a_volume_pods_accept(k8s: DynamicClient, operator: Any, namespace: str) -> None:
    name = unique("llama") + ".v3.1"
    create_cache(k8s, namespace, name, shared_spec())
    volume = wait_for_status(k8s, namespace, name, lambda s: s.get("volume"), "status.volume")["volume"]
    assert "." not in volume["volume"]["name"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "server"},
        "spec": {
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai", "volumeMounts": [volume["volumeMount"]]}],
            "volumes": [volume["volume"]],
        },
    }
    resource(k8s, "v1", "Pod").create(body=pod, namespace=namespace, dry_run="All")


def test_a_users_claim_under_the_default_name_is_never_taken_over(
    k8s: DynamicClient, operator: Any, namespace: str
) -> None:
    """Forced apply would make the cache the claim's controller, and deleting the cache would delete it."""
    name = unique("llama")
    claims = resource(k8s, "v1", "PersistentVolumeClaim")
    claims.create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": f"{name}-model", "labels": {"team": "data"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    create_cache(k8s, namespace, name, shared_spec())
    wait_for_status(
        k8s, namespace, name, lambda s: condition({"status": s}, "Ready").get("reason") == "NameConflict", "conflict"
    )
    ready = condition(get_cache(k8s, namespace, name), "Ready")
    assert ready["status"] == "False" and "claimName" in ready["message"]
    assert any(e["type"] == "Warning" and e["reason"] == "NameConflict" for e in events_for(k8s, namespace, name))
    claim = claims.get(name=f"{name}-model", namespace=namespace).to_dict()
    assert not claim["metadata"].get("ownerReferences") and claim["spec"]["resources"]["requests"]["storage"] == "1Gi"
    assert cache_jobs(k8s, namespace, name) == []

    delete_and_collect(k8s, API_VERSION, "ModelCache", name, namespace)  # the garbage collector is done with it
    claim = get_or_none(k8s, "v1", "PersistentVolumeClaim", f"{name}-model", namespace)
    assert claim is not None and claim.metadata.deletionTimestamp is None
