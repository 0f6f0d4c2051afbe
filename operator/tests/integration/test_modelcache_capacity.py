"""Node budgets on the real control plane: a NodeCachePolicy (cluster-scoped CRD, CEL on its watermarks), the
candidates a node's preload Job is given (LRU, never a pinned cache, never one a pod on that node consumes), and
what the Job's reported eviction or InsufficientStorage does to status and node labels.

Nodes are fake (kwok, no kubelet): the test reports the Jobs' pods as ended with the loader's result, as the
other NodeLocal tests do (test_modelcache_support.finish_job). The eviction on a real filesystem is tested in
loader/tests/integration/test_node_capacity.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ApiException
from strata_loader.capacity import EXIT_INSUFFICIENT_STORAGE, CapacityReport, CapacityRequest
from strata_loader.contract import FetchResult
from strata_operator.api import API_VERSION
from strata_operator.resources.modelcache.names import node_label_key
from strata_testsupport.kube import resource, wait_for

from .test_modelcache_nodelocal import node_labels
from .test_modelcache_support import (
    Heartbeat,
    create_cache,
    fetch_result,
    finish_job,
    unique,
    wait_for_status,
)

pytestmark = pytest.mark.integration
SOURCE = "hf://meta-llama/Llama-3.1-8B"
GiB = 2**30


@pytest.fixture
def policy(k8s: DynamicClient) -> Iterator[dict[str, str]]:
    """A NodeCachePolicy covering only this test's nodes (cluster-scoped: other tests must not see it)."""
    pool = {"strata-test/pool": unique("budget")}
    name = unique("ncp")
    policies = resource(k8s, API_VERSION, "NodeCachePolicy")
    policies.create(
        body={
            "apiVersion": API_VERSION,
            "kind": "NodeCachePolicy",
            "metadata": {"name": name},
            "spec": {"nodeSelector": pool, "highWatermark": 85, "lowWatermark": 70},
        }
    )
    yield {"name": name, **pool}
    policies.delete(name=name)


def node_local(pool: dict[str, str], **extra: Any) -> dict[str, Any]:
    local = {"nodeSelector": pool, "fanOut": {"enabled": False}, **extra}  # fan-out has its own tests
    return {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": local}}


def ready_copy(k8s: DynamicClient, namespace: str, pool: dict[str, str], prefix: str, **extra: Any) -> str:
    name = unique(prefix)
    create_cache(k8s, namespace, name, node_local(pool, **extra))
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 1, f"{prefix}'s Job")
    finish_job(k8s, namespace, status["nodes"][0]["job"], fetch_result(SOURCE))
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", f"{prefix} Ready")
    return name


def job_budget(k8s: DynamicClient, namespace: str, job_name: str) -> tuple[CapacityRequest, dict[str, Any]]:
    job = resource(k8s, "batch/v1", "Job").get(name=job_name, namespace=namespace).to_dict()
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    return CapacityRequest.model_validate_json(env["STRATA_NODE_CAPACITY"]), job


def consumer_pod(k8s: DynamicClient, namespace: str, cache: str, node: str) -> None:
    """A serving pod bound to the node, as the scheduler would bind one the webhook sent to the copy."""
    resource(k8s, "v1", "Pod").create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": unique("vllm"), "labels": {"strata.dev/model-cache": cache}},
            "spec": {"nodeName": node, "containers": [{"name": "vllm", "image": "vllm/vllm-openai:v0.33.0"}]},
        },
    )


def test_candidates_reach_the_job_and_a_reported_eviction_lands_in_status_and_labels(
    k8s: DynamicClient, operator: Any, namespace: str, nodes: Heartbeat, policy: dict[str, str]
) -> None:
    pool = {"strata-test/pool": policy["strata-test/pool"]}
    node = nodes.add(unique("gpu"), pool)
    idle = ready_copy(k8s, namespace, pool, "idle")
    pinned = ready_copy(k8s, namespace, pool, "pinned", pinned=True)
    busy = ready_copy(k8s, namespace, pool, "busy")
    consumer_pod(k8s, namespace, busy, node)

    new = unique("new")
    create_cache(k8s, namespace, new, node_local(pool))
    status = wait_for_status(k8s, namespace, new, lambda s: s.get("desiredNodes") == 1, "the new cache's Job")
    job_name = status["nodes"][0]["job"]
    given, job = job_budget(k8s, namespace, job_name)
    assert given.candidates == [f"{namespace}/{idle}"]
    assert sorted(given.protected) == [
        f"{namespace}/{busy} (in use by 1 pod(s) on this node)",
        f"{namespace}/{pinned} (pinned by its cache)",
    ]
    assert (given.policy, given.high_watermark, given.low_watermark) == (policy["name"], 85, 70)
    assert job["spec"]["podFailurePolicy"]["rules"][0]["onExitCodes"]["values"] == [EXIT_INSUFFICIENT_STORAGE]
    assert status["nodes"][0]["policy"] == policy["name"]

    report = CapacityReport(
        policy=policy["name"],
        size_bytes=100 * GiB,
        used_bytes=61 * GiB,
        free_bytes=39 * GiB,
        evicted=[{"copy_key": f"{namespace}/{idle}", "bytes": 5 * GiB}],
    )
    finish_job(k8s, namespace, job_name, fetch_result(SOURCE, capacity=report))
    status = wait_for_status(k8s, namespace, new, lambda s: s.get("phase") == "Ready", "the new copy Ready")
    state = status["nodes"][0]
    assert (state["usedBytes"], state["freeBytes"], state["evicted"]) == (61 * GiB, 39 * GiB, [f"{namespace}/{idle}"])
    assert state["lastUsed"]

    idle_key = node_label_key(namespace, idle)
    wait_for(lambda: node_labels(k8s, node).get(idle_key) == "Evicted", what="the evicted copy's label")
    evicted = wait_for_status(
        k8s, namespace, idle, lambda s: s.get("nodes") and s["nodes"][0]["phase"] == "Evicted", "idle Evicted"
    )
    assert evicted["phase"] == "Degraded" and evicted["readyNodes"] == 0
    labels = node_labels(k8s, node)
    assert labels[node_label_key(namespace, pinned)] == "Ready"
    assert labels[node_label_key(namespace, busy)] == "Ready"

    # Someone removes the Evicted label: the cache fetches its copy again with a new Job.
    resource(k8s, "v1", "Node").patch(
        name=node, body={"metadata": {"labels": {idle_key: None}}}, content_type="application/merge-patch+json"
    )
    again = wait_for_status(
        k8s, namespace, idle, lambda s: s["nodes"][0]["phase"] == "Preloading", "idle fetching again"
    )
    given_again, _ = job_budget(k8s, namespace, again["nodes"][0]["job"])
    assert f"{namespace}/{new}" in given_again.candidates  # the new copy is idle: it may go now


def test_a_copy_that_cannot_fit_ends_insufficient_storage_without_retries(
    k8s: DynamicClient, operator: Any, namespace: str, nodes: Heartbeat, policy: dict[str, str]
) -> None:
    pool = {"strata-test/pool": policy["strata-test/pool"]}
    nodes.add(unique("gpu"), pool)
    name = unique("huge")
    create_cache(k8s, namespace, name, node_local(pool))
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 1, "the Job")
    job_name = status["nodes"][0]["job"]
    message = (
        "the copy needs 80000000000 more bytes but /strata/node (NodeCachePolicy x) has 30000000000 free of "
        "100000000000 (70000000000 used); the high watermark 85% allows 85000000000 used"
    )
    failed = FetchResult(
        status="Failed",
        error=message,
        source=SOURCE,
        reason="InsufficientStorage",
        capacity=CapacityReport(policy=policy["name"], used_bytes=70 * 10**9, free_bytes=30 * 10**9),
    )
    finish_job(k8s, namespace, job_name, failed, succeeded=False, exit_code=EXIT_INSUFFICIENT_STORAGE)
    status = wait_for_status(
        k8s, namespace, name, lambda s: s["nodes"][0]["phase"] == "InsufficientStorage", "InsufficientStorage"
    )
    state = status["nodes"][0]
    assert "80000000000 more bytes" in state["message"] and state["freeBytes"] == 30 * 10**9
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "InsufficientStorage"
    # the podFailurePolicy failed the Job at once: no retry pod was created
    job = wait_for(
        lambda: (
            (j := resource(k8s, "batch/v1", "Job").get(name=job_name, namespace=namespace).to_dict())
            .get("status", {})
            .get("failed")
            and j
        ),
        what="the Job failed",
    )
    assert any(c["type"] == "Failed" and c["reason"] == "PodFailurePolicy" for c in job["status"]["conditions"])
    pods = resource(k8s, "v1", "Pod").get(
        namespace=namespace, label_selector=f"batch.kubernetes.io/job-name={job_name}"
    )
    assert len(pods.items) == 1


@pytest.mark.parametrize(
    "spec,message",
    [
        ({"highWatermark": 80, "lowWatermark": 80}, "lowWatermark must be below highWatermark"),
        ({"highWatermark": 101}, "spec.highWatermark"),
        ({"lowWatermark": -1}, "spec.lowWatermark"),
        ({"path": "/var/lib"}, "spec.path"),
        ({"minFree": "1.5Gi"}, "minFree must be a whole number of bytes"),
        ({"namespaceBudget": "1.5Gi"}, "namespaceBudget must be a whole number of bytes"),
        ({"namespaceBudgets": [{"namespace": "a", "maxBytes": "10m"}]}, "maxBytes must be a whole number"),
        ({"pinned": [{"namespace": "Team_A"}]}, "spec.pinned[0].namespace"),
    ],
)
def test_the_api_server_refuses_watermarks_out_of_order_or_range(
    k8s: DynamicClient, strata_crds: Any, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(ApiException) as refused:
        resource(k8s, API_VERSION, "NodeCachePolicy").create(
            body={
                "apiVersion": API_VERSION,
                "kind": "NodeCachePolicy",
                "metadata": {"name": unique("bad")},
                "spec": spec,
            }
        )
    assert refused.value.status == 422
    assert message in json.loads(refused.value.body)["message"]


def test_the_sample_policy_is_accepted_with_its_defaults(k8s: DynamicClient, strata_crds: Any) -> None:
    sample = Path(__file__).resolve().parents[3] / "samples" / "nodecachepolicy-gpu-nvme.yaml"
    body = yaml.safe_load(sample.read_text())
    stored = resource(k8s, API_VERSION, "NodeCachePolicy").create(body=body, dry_run="All").to_dict()
    assert stored["spec"]["highWatermark"] == 90 and stored["spec"]["lowWatermark"] == 80
    assert stored["spec"]["minFree"] == "100Gi"
    defaulted = resource(k8s, API_VERSION, "NodeCachePolicy").create(
        body={"apiVersion": API_VERSION, "kind": "NodeCachePolicy", "metadata": {"name": unique("d")}, "spec": {}},
        dry_run="All",
    )
    assert defaulted.to_dict()["spec"] == {
        "highWatermark": 90,
        "lowWatermark": 80,
        "path": "/var/lib/strata/models",
        "evictAcrossNamespaces": False,
    }
