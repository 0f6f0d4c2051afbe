"""NodeLocal end to end: a pinned preloader Job per selected Ready node, node labels, nodes joining and
leaving, drift repair of labels, and clean-up through the finalizer. Nodes are fake (no kubelet here): the
test keeps them Ready and reports the Jobs' pods as ended (see test_modelcache_support)."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from strata_operator.api import API_VERSION
from strata_testsupport.kube import get_or_none, resource, wait_for

from .test_modelcache_support import (
    Heartbeat,
    cache_jobs,
    create_cache,
    fetch_result,
    finish_job,
    unique,
    wait_for_status,
)

pytestmark = pytest.mark.integration
SOURCE = "hf://meta-llama/Llama-3.1-8B"


def node_labels(k8s: DynamicClient, name: str) -> dict[str, str]:
    return dict(resource(k8s, "v1", "Node").get(name=name).metadata.labels or {})


def finish_pending(k8s: DynamicClient, namespace: str, status: dict[str, Any]) -> None:
    for node in status["nodes"]:
        if node["phase"] == "Preloading":
            finish_job(k8s, namespace, node["job"], fetch_result(SOURCE))


def test_node_local_follows_nodes_and_cleans_up(
    k8s: DynamicClient, operator: Any, namespace: str, nodes: Heartbeat
) -> None:
    pool = {"strata-test/pool": unique("pool")}
    a = nodes.add(unique("gpu-a"), pool)
    b = nodes.add(unique("gpu-b"), pool)
    other = nodes.add(unique("cpu"))
    name = unique("mc")
    local = {"nodeSelector": pool, "fanOut": {"enabled": False}}  # every node reads the source (fan-out: its own test)
    spec = {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": local}}
    create_cache(k8s, namespace, name, spec)

    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 2, "two selected nodes")
    assert {n["name"] for n in status["nodes"]} == {a, b}
    job = resource(k8s, "batch/v1", "Job").get(name=status["nodes"][0]["job"], namespace=namespace).to_dict()
    affinity = job["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    pinned = affinity["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchFields"][0]
    assert pinned["values"] == [status["nodes"][0]["name"]]
    finish_pending(k8s, namespace, status)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "both copies Ready")
    key = status["nodeLabel"]
    assert status["readyNodes"] == 2 and status["volume"]["nodeSelector"] == {key: "Ready"}
    assert node_labels(k8s, a)[key] == "Ready" and node_labels(k8s, b)[key] == "Ready"
    assert key not in node_labels(k8s, other)

    c = nodes.add(unique("gpu-c"), pool)  # a node joins
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 3, "the new node")
    assert status["phase"] == "Preloading" and status["readyNodes"] == 2
    finish_pending(k8s, namespace, status)
    wait_for_status(k8s, namespace, name, lambda s: s.get("readyNodes") == 3, "three copies")
    wait_for(lambda: node_labels(k8s, c).get(key) == "Ready", what="the new node labelled")

    resource(k8s, "v1", "Node").patch(  # drift: someone removes our label
        name=a, body={"metadata": {"labels": {key: None}}}, content_type="application/merge-patch+json"
    )
    wait_for(lambda: node_labels(k8s, a).get(key) == "Ready", what="the label put back")

    nodes.remove(b)  # a node leaves
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 2, "the node gone")
    assert {n["name"] for n in status["nodes"]} == {a, c} and status["phase"] == "Ready"

    resource(k8s, API_VERSION, "ModelCache").delete(name=name, namespace=namespace)
    cleanup = wait_for(
        lambda: len(cache_jobs(k8s, namespace, name, "cleanup")) == 2 and cache_jobs(k8s, namespace, name, "cleanup"),
        what="a clean-up Job per node with a copy",
    )
    assert all(key not in node_labels(k8s, n) for n in (a, c))
    assert get_or_none(k8s, API_VERSION, "ModelCache", name, namespace) is not None  # held by the finalizer
    for job in cleanup:
        args = job["spec"]["template"]["spec"]["containers"][0]["args"]
        assert args == [f"rm -rf -- '/strata/node/{namespace}/{name}'"]
        finish_job(k8s, namespace, job["metadata"]["name"], None)
    wait_for(lambda: get_or_none(k8s, API_VERSION, "ModelCache", name, namespace) is None, what="the cache gone")


def test_node_local_without_matching_nodes_waits(
    k8s: DynamicClient, operator: Any, namespace: str, nodes: Heartbeat
) -> None:
    name = unique("mc")
    selector = {"strata-test/pool": unique("empty")}
    spec = {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": {"nodeSelector": selector}}}
    create_cache(k8s, namespace, name, spec)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Pending", "phase Pending")
    assert status["desiredNodes"] == 0 and status["conditions"][0]["reason"] == "NoMatchingNodes"


def test_retain_policy_keeps_copies(k8s: DynamicClient, operator: Any, namespace: str, nodes: Heartbeat) -> None:
    pool = {"strata-test/pool": unique("pool")}
    a = nodes.add(unique("gpu-a"), pool)
    name = unique("mc")
    spec = {
        "source": {"uri": SOURCE},
        "storage": {"mode": "NodeLocal", "nodeLocal": {"nodeSelector": pool}},
        "deletionPolicy": "Retain",
    }
    create_cache(k8s, namespace, name, spec)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 1, "one node")
    finish_pending(k8s, namespace, status)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "Ready")
    resource(k8s, API_VERSION, "ModelCache").delete(name=name, namespace=namespace)
    wait_for(lambda: get_or_none(k8s, API_VERSION, "ModelCache", name, namespace) is None, what="the cache gone")
    assert cache_jobs(k8s, namespace, name, "cleanup") == []
    assert status["nodeLabel"] not in node_labels(k8s, a)


def test_deleting_the_namespace_does_not_hang_and_records_the_copy(
    k8s: DynamicClient, operator: Any, nodes: Heartbeat
) -> None:
    """No clean-up Job can be created in a namespace being deleted (403): the finalizer gives up at once and
    the copy left behind is recorded on its node, instead of the namespace staying Terminating forever."""
    namespace = unique("t-ns")
    namespaces = resource(k8s, "v1", "Namespace")
    namespaces.create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    pool = {"strata-test/pool": unique("pool")}
    a = nodes.add(unique("gpu-a"), pool)
    name = unique("mc")
    spec = {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": {"nodeSelector": pool}}}
    create_cache(k8s, namespace, name, spec)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 1, "one node")
    finish_pending(k8s, namespace, status)
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "Ready")

    namespaces.delete(name=namespace)
    wait_for(lambda: get_or_none(k8s, "v1", "Namespace", namespace, None) is None, timeout=90, what="namespace gone")
    annotations = resource(k8s, "v1", "Node").get(name=a).metadata.annotations or {}
    assert annotations[f"strata.dev/leftover.{namespace}.{name}"] == f"/var/lib/strata/models/{namespace}/{name}"
    events = resource(k8s, "v1", "Event").get(namespace="default", field_selector=f"involvedObject.name={a}").items
    assert any(e.reason == "ModelCopyLeftBehind" and name in e.message for e in events)


def test_a_zero_ttl_cannot_make_jobs_vanish_before_their_result_is_read(
    k8s: DynamicClient, operator: Any, namespace: str, nodes: Heartbeat
) -> None:
    """With ttlSecondsAfterFinished 0 a finished Job vanished before its result was read and was created
    again at once, in a loop (306 Jobs in 110 s over 3 nodes)."""
    pool = {"strata-test/pool": unique("pool")}
    for prefix in ("gpu-a", "gpu-b", "gpu-c"):
        nodes.add(unique(prefix), pool)
    name = unique("mc")
    spec = {
        "source": {"uri": SOURCE},
        "storage": {"mode": "NodeLocal", "nodeLocal": {"nodeSelector": pool, "fanOut": {"enabled": False}}},
        "preload": {"ttlSecondsAfterFinished": 0},
    }
    create_cache(k8s, namespace, name, spec)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 3, "three nodes")
    jobs = cache_jobs(k8s, namespace, name)
    assert jobs and all(j["spec"]["ttlSecondsAfterFinished"] == 60 for j in jobs)
    finish_pending(k8s, namespace, status)
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "all three copies Ready")
    assert len(cache_jobs(k8s, namespace, name)) == 3  # one Job per node, still there to be read
