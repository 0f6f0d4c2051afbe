"""KVCacheTier on the real node, run by the operator the chart installed: the DaemonSet pod serves from the
rendered ConfigMap (read-only root filesystem, non-root, probes passing), a client pod that takes the
connection ConfigMap with envFrom reaches it through the Service's DNS name and round-trips chunks, a killed
server pod is replaced by one that still serves them from L2, and the status shows usage scraped from the pod."""

from __future__ import annotations

import time

import pytest
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import NODE_NAME
from strata_testsupport.pods import API, RUNTIME_UID, kv_client_pod, kv_tier_spec, kv_token_secret, rwx_claim, unique

pytestmark = [pytest.mark.integration, pytest.mark.realnode]


def server_pods(node_k8s, namespace: str, tier: str) -> list[dict]:
    pods = resource(node_k8s, "v1", "Pod").get(namespace=namespace, label_selector=f"app.kubernetes.io/instance={tier}")
    return [p for p in pods.to_dict()["items"] if not p["metadata"].get("deletionTimestamp")]


def ready_server(node_k8s, namespace: str, tier: str, not_uid: str | None = None) -> dict:
    def ready() -> dict | None:
        for pod in server_pods(node_k8s, namespace, tier):
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if pod["metadata"]["uid"] != not_uid and statuses and all(s["ready"] for s in statuses):
                return pod
        return None

    return wait_for(ready, timeout=180, interval=1, what=f"a ready server pod of {tier}")


def test_tier_serves_chunks_by_service_name_and_keeps_them_across_a_killed_pod(
    node_k8s, node_operator, restricted_namespace
):
    namespace, tier = restricted_namespace, unique("kv")
    kv_token_secret(node_k8s, namespace)
    claim = f"{tier}-l2"
    rwx_claim(node_k8s, namespace, claim)
    started = time.monotonic()
    resource(node_k8s, API, "KVCacheTier").create(
        namespace=namespace,
        body={"apiVersion": API, "kind": "KVCacheTier", "metadata": {"name": tier}, "spec": kv_tier_spec(claim)},
    )
    first = ready_server(node_k8s, namespace, tier)
    print(f"KVCacheTier apply -> server ready: {time.monotonic() - started:.1f}s")
    container = first["spec"]["containers"][0]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["runAsNonRoot"] is True and first["spec"]["nodeName"] == NODE_NAME
    assert container["readinessProbe"] and container["livenessProbe"]
    assert (
        first["spec"].get("securityContext", {}).get("runAsUser") or container["securityContext"].get("runAsUser")
    ) == RUNTIME_UID

    written = kv_client_pod(node_k8s, namespace, tier, "writer", "write", 40)
    assert written["host"] == f"{tier}.{namespace}.svc"
    read = kv_client_pod(node_k8s, namespace, tier, "reader", "read", 40)
    assert all(read[f"chunk-{i:04d}"] for i in range(40)), read

    def usage_scraped() -> dict | None:
        status = resource(node_k8s, API, "KVCacheTier").get(name=tier, namespace=namespace).to_dict()["status"]
        usage = status.get("usage") or {}
        return status if usage.get("tiers") and any(t.get("usedBytes") for t in usage["tiers"]) else None

    status = wait_for(usage_scraped, timeout=120, interval=2, what="usage scraped from the server pod")
    assert status["readyInstances"] == 1, status

    resource(node_k8s, "v1", "Pod").delete(
        name=first["metadata"]["name"], namespace=namespace, body={"gracePeriodSeconds": 0}
    )
    second = ready_server(node_k8s, namespace, tier, not_uid=first["metadata"]["uid"])
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    again = kv_client_pod(node_k8s, namespace, tier, "reader-after-restart", "read", 40)
    assert all(again[f"chunk-{i:04d}"] for i in range(40)), again
