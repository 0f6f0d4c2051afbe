"""The `strata.dev/model-ready` scheduling gate on the real control plane: a pod admitted before its cache is
Ready waits gated, and the operator lifts the gate once the cache is Ready, after which the real kube-scheduler
places it on the node holding the copy; a failed cache keeps the gate and says so on the pod."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.webhook import RunningWebhook

from .test_modelcache_support import (
    Heartbeat,
    create_cache,
    events_for,
    fetch_result,
    finish_job,
    unique,
    wait_for_status,
)
from .test_serving_webhook import create_pod, kv_tier, pod_body

pytestmark = pytest.mark.integration
GATE = {"name": "strata.dev/model-ready"}


def get_pod(k8s: DynamicClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(resource(k8s, "v1", "Pod").get(name=name, namespace=namespace).to_dict())


def scheduling(pod: dict[str, Any]) -> str | None:
    """The reason of the pod's PodScheduled condition (SchedulingGated while a gate is on)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c.get("reason") for c in conditions if c["type"] == "PodScheduled"), None)


def pod_event(k8s: DynamicClient, namespace: str, pod: str, reason: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        return next((e for e in events_for(k8s, namespace, pod) if e["reason"] == reason), None)

    return wait_for(find, timeout=30, what=f"a {reason} Event on pod {pod}")


def test_a_gated_pod_schedules_onto_the_copy_once_the_cache_is_ready(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook, nodes: Heartbeat
) -> None:
    pool = {"strata-test/pool": unique("pool")}
    node = nodes.add(unique("gpu"), pool)
    nodes.add(unique("gpu-without-copy"))
    name = unique("mc")
    source = "hf://meta-llama/Llama-3.1-8B"
    spec = {"source": {"uri": source}, "storage": {"mode": "NodeLocal", "nodeLocal": {"nodeSelector": pool}}}
    create_cache(k8s, namespace, name, spec)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("nodes"), "the node's preload")

    pod = create_pod(k8s, namespace, pod_body("vllm", {"strata.dev/model-cache": name}))
    assert pod["spec"]["schedulingGates"] == [GATE]
    assert f"waiting for ModelCache {name}" in pod_event(k8s, namespace, "vllm", "WaitingForModelCache")["message"]
    assert wait_for(lambda: scheduling(get_pod(k8s, namespace, "vllm")), what="PodScheduled") == "SchedulingGated"

    finish_job(k8s, namespace, status["nodes"][0]["job"], fetch_result(source))
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "the copy Ready")
    placed = wait_for(lambda: get_pod(k8s, namespace, "vllm")["spec"].get("nodeName"), what="the pod scheduled")
    assert placed == node, "the scheduler must pick the node with the copy"
    assert not get_pod(k8s, namespace, "vllm")["spec"].get("schedulingGates")
    pod_event(k8s, namespace, "vllm", "ModelCacheReady")


def test_a_failed_cache_keeps_the_gate_and_says_so_on_the_pod(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    name = unique("mc")
    source = "s3://models/llama-3-8b"
    spec = {
        "source": {"uri": source},
        "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}},
        "preload": {"backoffLimit": 0},
    }
    create_cache(k8s, namespace, name, spec)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("job"), "a preloader Job")
    pod = create_pod(k8s, namespace, pod_body("vllm", {"strata.dev/model-cache": name}))
    assert pod["spec"]["schedulingGates"] == [GATE]

    error = "AccessDenied: s3://models/llama-3-8b is not readable with the given credentials"
    result = fetch_result(source, status="Failed", error=error, files=0, bytes=0)
    finish_job(k8s, namespace, status["job"], result, succeeded=False)
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Failed", "phase Failed")
    warning = pod_event(k8s, namespace, "vllm", "ModelCacheDegraded")
    assert warning["type"] == "Warning" and "AccessDenied" in warning["message"]
    assert get_pod(k8s, namespace, "vllm")["spec"]["schedulingGates"] == [GATE]


def test_a_deployment_pod_gated_before_the_revision_is_replaced_with_one_wired_with_it(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    """Wired while its cache preloaded, the Deployment's gated pod names the cache's request (`req-`); once the cache
    is Ready with a revision, the operator deletes it at the gate and the ReplicaSet controller creates it again,
    wired with the revision every later pod gets (webhook/wiring.rewire_revision)."""
    name = unique("mc")
    source = "s3://models/llama-3-8b"
    create_cache(
        k8s,
        namespace,
        name,
        {"source": {"uri": source}, "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}}},
    )
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("job"), "a preloader Job")
    tier = kv_tier(k8s, namespace)
    labels = {"app": "vllm", "strata.dev/model-cache": name, "strata.dev/kv-cache-tier": tier}
    template = pod_body("unused", labels)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vllm"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "vllm"}},
            "template": {"metadata": {"labels": labels}, "spec": template["spec"]},
        },
    }
    resource(k8s, "apps/v1", "Deployment").create(body=deployment, namespace=namespace)

    def the_pod() -> dict[str, Any] | None:
        found = resource(k8s, "v1", "Pod").get(namespace=namespace, label_selector="app=vllm").to_dict()["items"]
        live = [p for p in found if not p["metadata"].get("deletionTimestamp")]
        return live[0] if len(live) == 1 else None

    gated_pod = wait_for(the_pod, timeout=60, what="the Deployment's pod")
    assert gated_pod["spec"]["schedulingGates"] == [GATE]
    assert gated_pod["metadata"]["annotations"]["strata.dev/model-revision"].startswith("req-")

    finish_job(k8s, namespace, status["job"], fetch_result(source))
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "phase Ready")

    def replacement() -> dict[str, Any] | None:
        pod = the_pod()
        return pod if pod is not None and pod["metadata"]["uid"] != gated_pod["metadata"]["uid"] else None

    pod = wait_for(replacement, timeout=60, what="the pod re-created by the ReplicaSet")
    assert pod["metadata"]["annotations"]["strata.dev/model-revision"] == "5e" * 6, "fetch_result's manifest"
    (vllm,) = pod["spec"]["containers"]
    assert {"name": "STRATA_MODEL_DIR", "value": "/models/rev-" + "5e" * 6} in vllm["env"]
    assert not pod["spec"].get("schedulingGates"), "wired once the cache is Ready: no gate"
    replaced = wait_for(
        lambda: next((e for e in events_for(k8s, namespace, name) if e["reason"] == "GatedPodReplaced"), None),
        timeout=30,
        what="a GatedPodReplaced Event on the cache",
    )
    assert gated_pod["metadata"]["name"] in replaced["message"]
