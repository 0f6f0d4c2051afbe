"""Eviction between tenants, as the operator decides it: a NodeCachePolicy decides whose copies a namespace's
new copy may evict (its own, by default), who is pinned, and each namespace's budget; an evicted copy comes back
when one of its cache's pods waits for it, with no hand work on the node.

What is real here: the API server (the policy's schema and CEL rules), kube-controller-manager's Job controller,
and the operator's handlers end to end: the budget and candidates it gives each preload Job (read back from the
Job it created), the status, Events and node labels it writes from what a Job reports, and the Job it runs again
for a waiting pod. What is not: the nodes are kwok's (no kubelet, no disk; the test also writes their Ready
heartbeat), and no loader runs in the Jobs' pods: the test ends each pod as a kubelet would, with the
termination message a fetch would leave, including the capacity report of what it evicted (`finish_job`). So
nothing is evicted from any disk here: the loader's eviction on a real filesystem is tested in
loader/tests/integration/test_node_capacity.py, and budgets with real preloader Jobs on the real node in
realnode/tests/test_node_capacity.py."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from strata_loader.capacity import CapacityReport
from strata_operator.api import API_VERSION
from strata_operator.resources.modelcache.names import node_label_key
from strata_testsupport.kube import resource, wait_for

from .test_modelcache_nodelocal import node_labels
from .test_modelcache_support import Heartbeat, create_cache, fetch_result, finish_job, unique, wait_for_status

pytestmark = pytest.mark.integration
SOURCE = "hf://meta-llama/Llama-3.1-8B"
GiB = 2**30


@pytest.fixture
def second_namespace(k8s: DynamicClient) -> Iterator[str]:
    """Another tenant's namespace."""
    name = unique("tenant-a")
    namespaces = resource(k8s, "v1", "Namespace")
    namespaces.create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    namespaces.delete(name=name)


def make_policy(k8s: DynamicClient, **spec: Any) -> tuple[str, dict[str, str]]:
    pool = {"strata-test/pool": unique("tenants")}
    name = unique("ncp")
    resource(k8s, API_VERSION, "NodeCachePolicy").create(
        body={
            "apiVersion": API_VERSION,
            "kind": "NodeCachePolicy",
            "metadata": {"name": name},
            "spec": {"nodeSelector": pool, **spec},
        }
    )
    return name, pool


def node_local(pool: dict[str, str], **extra: Any) -> dict[str, Any]:
    local = {"nodeSelector": pool, "fanOut": {"enabled": False}, **extra}
    return {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": local}}


def ready_copy(k8s: DynamicClient, namespace: str, pool: dict[str, str], prefix: str, **extra: Any) -> str:
    name = unique(prefix)
    create_cache(k8s, namespace, name, node_local(pool, **extra))
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 1, f"{prefix}'s Job")
    finish_job(k8s, namespace, status["nodes"][0]["job"], fetch_result(SOURCE))
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", f"{prefix} Ready")
    return name


def new_copys_budget(k8s: DynamicClient, namespace: str, pool: dict[str, str]) -> tuple[str, str, Any]:
    from .test_modelcache_capacity import job_budget

    name = unique("new")
    create_cache(k8s, namespace, name, node_local(pool))
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 1, "the new cache's Job")
    job_name = status["nodes"][0]["job"]
    return name, job_name, job_budget(k8s, namespace, job_name)[0]


def waiting_consumer(k8s: DynamicClient, namespace: str, cache: str, selector: dict[str, str]) -> str:
    """A serving pod the scheduler has not placed: gated, as the webhook leaves it while the cache is not Ready,
    and required onto nodes where the copy is Ready."""
    name = unique("vllm")
    key = node_label_key(namespace, cache)
    affinity = {"nodeSelectorTerms": [{"matchExpressions": [{"key": key, "operator": "In", "values": ["Ready"]}]}]}
    resource(k8s, "v1", "Pod").create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": {"strata.dev/model-cache": cache}},
            "spec": {
                "nodeSelector": selector,
                "schedulingGates": [{"name": "strata.dev/model-ready"}],
                "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": affinity}},
                "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0"}],
            },
        },
    )
    return name


def test_another_namespaces_cache_cannot_evict_a_copy_nor_pin_itself_past_it(
    k8s: DynamicClient, operator: Any, namespace: str, second_namespace: str, nodes: Heartbeat
) -> None:
    name, pool = make_policy(k8s, highWatermark=85, lowWatermark=70, namespaceBudget="500Gi")
    try:
        nodes.add(unique("gpu"), pool)
        theirs = ready_copy(k8s, second_namespace, pool, "theirs")
        ours_pinned = ready_copy(k8s, namespace, pool, "ours", pinned=True)
        _, _, given = new_copys_budget(k8s, namespace, pool)
        assert given.candidates == []  # neither tenant A's idle copy nor our own self-pinned one
        assert f"{namespace}/{ours_pinned} (pinned by its cache)" in given.protected
        assert not any(second_namespace in p or theirs in p for p in given.protected)
        assert given.namespace_budget_bytes == 500 * GiB
    finally:
        resource(k8s, API_VERSION, "NodeCachePolicy").delete(name=name)


def test_an_evicted_copy_comes_back_when_a_pod_of_its_cache_waits_for_it(
    k8s: DynamicClient, operator: Any, namespace: str, nodes: Heartbeat
) -> None:
    policy, pool = make_policy(k8s, highWatermark=85, lowWatermark=70)
    try:
        node = nodes.add(unique("gpu"), pool)
        idle = ready_copy(k8s, namespace, pool, "idle")
        _, job_name, given = new_copys_budget(k8s, namespace, pool)
        assert given.candidates == [f"{namespace}/{idle}"]
        report = CapacityReport(
            policy=policy,
            used_bytes=61 * GiB,
            free_bytes=39 * GiB,
            evicted=[{"copy_key": f"{namespace}/{idle}", "bytes": GiB}],
        )
        finish_job(k8s, namespace, job_name, fetch_result(SOURCE, capacity=report))
        evicted = wait_for_status(
            k8s, namespace, idle, lambda s: s.get("nodes") and s["nodes"][0]["phase"] == "Evicted", "idle Evicted"
        )
        old_job = evicted["nodes"][0]["job"]
        assert node_labels(k8s, node)[node_label_key(namespace, idle)] == "Evicted"

        pod = waiting_consumer(k8s, namespace, idle, pool)  # nobody touches the node's labels
        again = wait_for_status(
            k8s, namespace, idle, lambda s: s["nodes"][0]["phase"] == "Preloading", "idle fetched again for the pod"
        )
        assert again["nodes"][0]["job"] == old_job  # the same request, its old Job deleted and created anew
        events = resource(k8s, "v1", "Event").get(namespace=namespace, field_selector=f"involvedObject.name={idle}")
        needed = [e.message for e in events.items if e.reason == "CopyNeededAgain"]
        assert needed and f"pod {pod} is waiting and could run on {node}" in needed[0]
        finish_job(k8s, namespace, old_job, fetch_result(SOURCE))
        wait_for(lambda: node_labels(k8s, node).get(node_label_key(namespace, idle)) == "Ready", what="Ready again")
    finally:
        resource(k8s, API_VERSION, "NodeCachePolicy").delete(name=policy)
