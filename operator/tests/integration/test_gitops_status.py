"""What Flux (kstatus itself, hack/kstatus) and Argo CD (the chart README's health check) read of a real NodeLocal
ModelCache that the operator reconciles against the local control plane, as it preloads, is Ready, loses a node and
gets it back, and is deleted: the status read back from the API server, not one rendered in the test. Expected
verdicts are `strata_testsupport.gitops.VERDICTS`, the table the unit tier checks every situation against."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from strata_operator.api import API_VERSION
from strata_testsupport.gitops import VERDICTS, ArgoHealth, KStatus
from strata_testsupport.kube import get_or_none, resource, wait_for

from .test_modelcache_support import (
    Heartbeat,
    cache_jobs,
    condition,
    create_cache,
    fetch_result,
    finish_job,
    get_cache,
    unique,
    wait_for_status,
)

pytestmark = pytest.mark.integration
SOURCE = "hf://meta-llama/Llama-3.1-8B"


def assert_verdicts(situation: str, cache: dict[str, Any], kstatus: KStatus, argo_health: ArgoHealth) -> None:
    flux, argo, shown = VERDICTS[situation]
    found_flux, found_argo = kstatus.verdict(cache), argo_health(cache)
    assert (found_flux.status, found_argo.status) == (flux, argo), (
        f"{situation}: kstatus {found_flux}, Argo CD {found_argo}; status {cache.get('status')}"
    )
    if shown is not None:
        assert found_flux.message == found_argo.message == condition(cache, shown)["message"]


def lose(k8s: DynamicClient, nodes: Heartbeat, name: str) -> None:
    """The node's kubelet goes silent: no more heartbeats (neither the fixture's nor kwok's), and its Ready condition
    turns Unknown, as the node lifecycle controller writes it after its grace period (written here at once, not
    waited for)."""
    nodes.silence(name)
    unknown = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
    }
    resource(k8s, "v1", "Node").status.patch(
        name=name, body={"status": {"conditions": [unknown]}}, content_type="application/strategic-merge-patch+json"
    )


def test_flux_and_argo_cd_read_a_reconciled_cache_as_the_table_says(
    k8s: DynamicClient, operator: Any, namespace: str, nodes: Heartbeat, kstatus: KStatus, argo_health: ArgoHealth
) -> None:
    pool = {"strata-test/pool": unique("pool")}
    a, b = nodes.add(unique("gpu-a"), pool), nodes.add(unique("gpu-b"), pool)
    name = unique("mc")
    local = {"nodeSelector": pool, "fanOut": {"enabled": False}}  # each node reads the source: two Jobs at once
    spec = {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": local}}
    create_cache(k8s, namespace, name, spec)

    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 2, "two copies under way")
    assert_verdicts("ModelCache preloading", get_cache(k8s, namespace, name), kstatus, argo_health)

    for node in status["nodes"]:
        finish_job(k8s, namespace, node["job"], fetch_result(SOURCE))
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "both copies Ready")
    assert_verdicts("ModelCache Ready", get_cache(k8s, namespace, name), kstatus, argo_health)

    lose(k8s, nodes, b)
    wait_for_status(k8s, namespace, name, lambda s: s.get("readyNodes") == 1, f"{b} not Ready", timeout=60)
    lost = get_cache(k8s, namespace, name)
    assert {n["name"]: n["phase"] for n in lost["status"]["nodes"]} == {a: "Ready", b: "NodeNotReady"}
    assert condition(lost, "Ready")["status"] == "True" and condition(lost, "Degraded")["reason"] == "NodeNotReady"
    situation = "ModelCache NodeLocal: a node lost, its copy Ready on another (usable, Degraded)"
    assert_verdicts(situation, lost, kstatus, argo_health)

    nodes.resume(b)  # the kubelet answers again
    wait_for_status(k8s, namespace, name, lambda s: s.get("readyNodes") == 2, f"{b} back", timeout=60)
    assert_verdicts("ModelCache Ready", get_cache(k8s, namespace, name), kstatus, argo_health)

    resource(k8s, API_VERSION, "ModelCache").delete(name=name, namespace=namespace)
    cleanup = wait_for(
        lambda: len(cache_jobs(k8s, namespace, name, "cleanup")) == 2 and cache_jobs(k8s, namespace, name, "cleanup"),
        what="a clean-up Job per node with a copy",
    )
    assert_verdicts("ModelCache being deleted", get_cache(k8s, namespace, name), kstatus, argo_health)
    for job in cleanup:
        finish_job(k8s, namespace, job["metadata"]["name"], None)
    wait_for(lambda: get_or_none(k8s, API_VERSION, "ModelCache", name, namespace) is None, what="the cache gone")
