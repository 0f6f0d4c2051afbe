"""The AdmissionReview answer for one request, with the caches looked up from a dict."""

from __future__ import annotations

import base64
import json
from typing import Any

from strata_operator.webhook.admission import decide, decide_deletion

CACHE = {
    "metadata": {"name": "llama", "namespace": "serving", "uid": "u"},
    "spec": {"source": {"uri": "s3://models/llama"}, "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}}},
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}


def lookup(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
    return CACHE if (kind, namespace, name) == ("ModelCache", "serving", "llama") else None


def request(labels: dict[str, str], operation: str = "CREATE") -> dict[str, Any]:
    pod = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "vllm"}]}}
    return {"uid": "1", "kind": {"kind": "Pod"}, "operation": operation, "namespace": "serving", "object": pod}


def test_a_labelled_pod_gets_a_json_patch() -> None:
    answer = decide(request({"strata.dev/model-cache": "llama"}), lookup)
    assert answer["allowed"] and answer["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(answer["patch"]))
    assert {op["path"] for op in ops} == {"/spec/volumes", "/spec/containers/0/volumeMounts", "/spec/containers/0/env"}


def test_unlabelled_pods_and_updates_pass_untouched() -> None:
    assert decide(request({"app": "x"}), lookup) == {"allowed": True}
    assert decide(request({"strata.dev/model-cache": "llama"}, "UPDATE"), lookup) == {"allowed": True}


def test_a_missing_object_is_refused_with_its_name() -> None:
    answer = decide(request({"strata.dev/kv-cache-tier": "kv"}), lookup)
    assert not answer["allowed"] and answer["status"]["code"] == 403
    assert (
        "KVCacheTier 'kv' (label strata.dev/kv-cache-tier) does not exist in namespace serving"
        in (answer["status"]["message"])
    )


def deletion(kind: str = "ModelCache", annotations: dict[str, str] | None = None) -> dict[str, Any]:
    old = {"metadata": {"name": "llama", "namespace": "serving", "annotations": annotations or {}}}
    return {
        "uid": "2",
        "kind": {"kind": kind},
        "operation": "DELETE",
        "name": "llama",
        "namespace": "serving",
        "oldObject": old,
    }


def pods_named(*names: str, phase: str = "Running") -> Any:
    def list_pods(namespace: str, selector: str) -> list[dict[str, Any]]:
        assert (namespace, selector) in (
            ("serving", "strata.dev/model-cache=llama"),
            ("serving", "strata.dev/kv-cache-tier=llama"),
        )
        return [{"metadata": {"name": n}, "status": {"phase": phase}} for n in names]

    return list_pods


def test_deleting_a_cache_in_use_is_refused_with_the_pods_named() -> None:
    answer = decide_deletion(deletion(), pods_named("vllm-b", "vllm-a"))
    assert not answer["allowed"]
    assert "ModelCache llama is used by 2 pod(s) (vllm-a, vllm-b)" in answer["status"]["message"]
    assert not decide_deletion(deletion("KVCacheTier"), pods_named("vllm-a"))["allowed"]


def test_a_cache_no_live_pod_uses_or_one_annotated_may_go() -> None:
    assert decide_deletion(deletion(), pods_named())["allowed"]
    assert decide_deletion(deletion(), pods_named("done", phase="Succeeded"))["allowed"]
    forced = deletion(annotations={"strata.dev/delete-while-in-use": "true"})
    assert decide_deletion(forced, pods_named("vllm-a"))["allowed"]
