"""Node budgets in the ModelCache plan, on plain observations: which copies a node's Job may evict and in what
order, what its capacity report does to status and to other caches' node labels, and how an evicted copy comes
back. The filesystem side (statvfs, eviction) is tested for real in loader/tests/integration/test_node_capacity.py.
"""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from pydantic import ValidationError
from strata_loader.capacity import ENV_NODE_CAPACITY, EXIT_INSUFFICIENT_STORAGE, CapacityReport, CapacityRequest
from strata_loader.contract import FetchResult
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.api.nodecachepolicy import NodeCachePolicySpec
from strata_operator.resources.modelcache import capacity, names, storage
from strata_operator.resources.modelcache.draft import LabelChange, Plan
from strata_operator.resources.modelcache.jobs import CONTAINER
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.plan import plan

from .test_modelcache_plan import NOW, OWNER, SOURCE, condition, deleted, ended, observe, pod_with_result

GiB = 2**30
# Every node's Job at once (fan-out sequences them; it has its own tests).
LOCAL = {"nodeSelector": {"pool": "gpu"}, "fanOut": {"enabled": False}}
SPEC = ModelCacheSpec.model_validate({"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": LOCAL}})
NODES = {
    "gpu-a": NodeInfo("gpu-a", "uid-a", True, {"pool": "gpu", "disk": "nvme"}),
    "gpu-b": NodeInfo("gpu-b", "uid-b", True, {"pool": "gpu"}),
}
POLICY = capacity.NodePolicy("nvme", NodeCachePolicySpec(nodeSelector={"disk": "nvme"}, highWatermark=85))
KEY = names.node_label_key(OWNER.namespace, OWNER.name)


def copy_on(name: str, *, node: str = "gpu-a", last_used: str, namespace: str = OWNER.namespace, **facts: Any):
    return capacity.CopyOnNode(
        namespace=namespace,
        name=name,
        node=node,
        path=facts.pop("path", "/var/lib/strata/models"),
        last_used=last_used,
        pinned=facts.pop("pinned", False),
        consumers=facts.pop("consumers", 0),
    )


def node_job(node: str) -> dict[str, Any]:
    return storage.node_preload(OWNER, SPEC, node, NODES[node].uid)[1]


def budget_of(job: dict[str, Any]) -> CapacityRequest | None:
    container = next(c for c in job["spec"]["template"]["spec"]["containers"] if c["name"] == CONTAINER)
    env = {e["name"]: e["value"] for e in container["env"]}
    return CapacityRequest.model_validate_json(env[ENV_NODE_CAPACITY]) if ENV_NODE_CAPACITY in env else None


def created_jobs(result: Plan) -> dict[str, dict[str, Any]]:
    """The Jobs a plan creates, by the node they are pinned to."""
    bodies = [dict(a.body) for a in result.actions if a.verb == "apply"]
    return {body["metadata"]["annotations"]["strata.dev/node"]: body for body in bodies}


VIEW = capacity.CapacityView(
    policies=[POLICY],
    copies=[
        copy_on("newer", last_used="2025-12-31T10:00:00Z"),
        copy_on("oldest", last_used="2025-12-01T00:00:00Z"),
        copy_on("pinned", last_used="2025-11-01T00:00:00Z", pinned=True),
        copy_on("busy", last_used="2025-11-01T00:00:00Z", consumers=2),
        copy_on("elsewhere", node="gpu-b", last_used="2025-11-01T00:00:00Z"),
        copy_on("other-path", last_used="2025-11-01T00:00:00Z", path="/mnt/scratch"),
        copy_on(OWNER.name, namespace=OWNER.namespace, last_used="2025-10-01T00:00:00Z"),
    ],
)


def test_a_nodes_job_may_evict_its_namespaces_other_idle_unpinned_copies_there_least_recently_used_first() -> None:
    result = plan(observe(SPEC, nodes=NODES, inputs_checked=True, capacity=VIEW))
    jobs = created_jobs(result)
    given = budget_of(jobs["gpu-a"])
    assert given is not None
    assert given.candidates == ["serving/oldest", "serving/newer"]
    assert given.protected == [
        "serving/busy (in use by 2 pod(s) on this node)",
        "serving/pinned (pinned by its cache)",
    ]
    assert (given.policy, given.high_watermark, given.low_watermark, given.root) == ("nvme", 85, 80, "/strata/node")
    rules = jobs["gpu-a"]["spec"]["podFailurePolicy"]["rules"]
    assert rules == [
        {
            "action": "FailJob",
            "onExitCodes": {"containerName": CONTAINER, "operator": "In", "values": [EXIT_INSUFFICIENT_STORAGE]},
        }
    ]
    states = {s["name"]: s for s in result.status["nodes"]}
    assert states["gpu-a"]["policy"] == "nvme" and "policy" not in states["gpu-b"]


def test_a_node_no_policy_covers_gets_no_budget_and_the_same_job_name() -> None:
    result = plan(observe(SPEC, nodes=NODES, inputs_checked=True, capacity=VIEW))
    jobs = created_jobs(result)
    assert budget_of(jobs["gpu-b"]) is None and "podFailurePolicy" not in jobs["gpu-b"]["spec"]
    # the budget is outside the request hash: the Job's name is the one it has without any policy
    assert jobs["gpu-a"]["metadata"]["name"] == node_job("gpu-a")["metadata"]["name"]


def test_the_first_policy_by_name_covering_node_and_path_applies() -> None:
    other = capacity.NodePolicy("a-first", NodeCachePolicySpec(highWatermark=70, lowWatermark=60))
    scratch = capacity.NodePolicy("0-scratch", NodeCachePolicySpec(path="/mnt/scratch"))
    assert capacity.policy_for([POLICY, other, scratch], NODES["gpu-a"], "/var/lib/strata/models") == other
    assert capacity.policy_for([POLICY, scratch], NODES["gpu-b"], "/var/lib/strata/models") is None


def test_a_job_evicting_every_candidate_can_still_report_it() -> None:
    """Names of 63 + 63 characters: fewer than 32 fit, and the full report of evicting them all fits the
    4096-byte termination message with a long error next to it, so no eviction goes unreported."""
    long = [
        copy_on(f"{i:02}" + "m" * 61, namespace="n" * 63, last_used=f"2025-12-{i + 1:02}T00:00:00Z") for i in range(30)
    ]
    across = capacity.NodePolicy("nvme", POLICY.spec.model_copy(update={"evict_across_namespaces": True}))
    given = capacity.budget(capacity.CapacityView([across], long), OWNER, SPEC, NODES["gpu-a"])
    assert given is not None and 10 <= len(given.candidates) < 30
    report = CapacityReport(
        policy="p" * 253,
        size_bytes=2**50,
        used_bytes=2**50,
        free_bytes=2**50,
        needed_bytes=2**50,
        high_bytes=2**50,
        low_bytes=2**50,
        evicted=[{"copy_key": c, "bytes": 2**50} for c in given.candidates],
    )
    failed = FetchResult(status="Failed", error="x" * 4000, source=SOURCE, reason="Insufficient", capacity=report)
    message = failed.to_termination_message()
    back = FetchResult.from_termination_message(message)
    assert back.capacity is not None and [e.copy_key for e in back.capacity.evicted] == given.candidates


def test_min_free_travels_as_bytes_and_must_be_whole() -> None:
    spec = NodeCachePolicySpec(minFree="200Gi")
    given = capacity.budget(capacity.CapacityView([capacity.NodePolicy("p", spec)]), OWNER, SPEC, NODES["gpu-a"])
    assert given is not None and given.min_free_bytes == 200 * GiB
    with pytest.raises(ValidationError, match="fraction"):
        NodeCachePolicySpec(minFree="1.5Gi")


def test_more_candidates_than_a_job_takes_are_cut_to_the_least_recently_used() -> None:
    many = [copy_on(f"m{i:02}", last_used=f"2025-12-{i + 1:02}T00:00:00Z") for i in range(30)]
    many += [copy_on(f"n{i:02}", last_used="2025-12-31T00:00:00Z") for i in range(10)]
    given = capacity.budget(capacity.CapacityView([POLICY], many), OWNER, SPEC, NODES["gpu-a"])
    assert given is not None and len(given.candidates) == 32
    assert given.candidates[:2] == ["serving/m00", "serving/m01"] and given.candidates[-1] == "serving/n01"


def reported(node: str, *, evicted: list[str], succeeded: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    job = node_job(node)
    name = job["metadata"]["name"]
    report = CapacityReport(
        policy="nvme",
        size_bytes=100 * GiB,
        used_bytes=70 * GiB,
        free_bytes=30 * GiB,
        evicted=[{"copy_key": c, "bytes": GiB} for c in evicted],
    )
    if succeeded:
        result = FetchResult(source=SOURCE, bytes=40 * GiB, files=3, capacity=report)
    else:
        result = FetchResult(
            status="Failed",
            error="the copy needs 40 more bytes but /strata/node has 30 free",
            source=SOURCE,
            reason="InsufficientStorage",
            capacity=report,
        )
    pods = {name: [pod_with_result(result, phase="Succeeded" if succeeded else "Failed")]}
    return {name: ended(job, succeeded=succeeded)}, pods


def test_a_reported_eviction_sets_the_evicted_caches_label_once_and_status_shows_usage() -> None:
    jobs, pods = reported("gpu-a", evicted=["team/oldest", "team/newer"])
    name = next(iter(jobs))
    previous = {"nodes": [{"name": "gpu-a", "job": name, "phase": "Preloading"}]}
    result = plan(observe(SPEC, nodes={"gpu-a": NODES["gpu-a"]}, jobs=jobs, pods=pods, previous=previous))
    (state,) = result.status["nodes"]
    assert state["phase"] == "Ready" and state["usedBytes"] == 70 * GiB and state["freeBytes"] == 30 * GiB
    assert state["evicted"] == ["team/oldest", "team/newer"] and state["lastUsed"] == "2026-01-01T00:00:00Z"
    evicted = [c for c in result.labels if c.foreign]
    assert evicted == [
        LabelChange("gpu-a", names.node_label_key("team", "oldest"), "Evicted", foreign=True),
        LabelChange("gpu-a", names.node_label_key("team", "newer"), "Evicted", foreign=True),
    ]
    assert LabelChange("gpu-a", KEY, "Ready") in result.labels

    again = plan(observe(SPEC, nodes={"gpu-a": NODES["gpu-a"]}, jobs=jobs, pods=pods, previous=result.status))
    assert [c for c in again.labels if c.foreign] == []  # a label someone removes is not set back


def test_a_copy_that_does_not_fit_is_insufficient_storage_and_retried_later() -> None:
    jobs, pods = reported("gpu-a", evicted=["team/oldest"], succeeded=False)
    name = next(iter(jobs))
    nodes = {"gpu-a": NODES["gpu-a"]}
    previous = {"nodes": [{"name": "gpu-a", "job": name, "phase": "Preloading"}]}
    result = plan(observe(SPEC, nodes=nodes, jobs=jobs, pods=pods, previous=previous))
    (state,) = result.status["nodes"]
    assert state["phase"] == "InsufficientStorage" and "needs 40 more bytes" in state["message"]
    assert state["freeBytes"] == 30 * GiB and state["retryAfter"] == "2026-01-01T00:05:00Z"
    degraded = condition(result, "Degraded")
    assert degraded["reason"] == "InsufficientStorage" and "30 free" in degraded["message"]
    assert result.status["phase"] == "Failed" and deleted(result) == []
    assert ("Warning", "NodeInsufficientStorage") in [e[:2] for e in result.events]
    assert [c.key for c in result.labels if c.foreign] == [names.node_label_key("team", "oldest")]

    later = observe(SPEC, nodes=nodes, jobs=jobs, pods=pods, previous=result.status)
    later.now = NOW + datetime.timedelta(minutes=5)
    retried = plan(later)
    assert deleted(retried) == [name]
    gone = observe(SPEC, nodes=nodes, previous=retried.status, inputs_checked=True, capacity=VIEW)
    gone.now = later.now
    again = plan(gone)  # created again at once (its retryAfter passed), with a fresh budget
    assert again.status["nodes"][0]["phase"] == "Preloading"
    assert budget_of(created_jobs(again)["gpu-a"]) is not None


def ready_before(node: str, **extra: Any) -> dict[str, Any]:
    return {
        "name": node,
        "job": node_job(node)["metadata"]["name"],
        "phase": "Ready",
        "bytes": 10,
        "files": 1,
        "lastUsed": "2025-12-31T00:00:00Z",
        **extra,
    }


def test_a_copy_evicted_by_another_cache_turns_evicted_and_its_label_stays() -> None:
    nodes = {
        "gpu-a": NodeInfo("gpu-a", "uid-a", True, {"pool": "gpu", KEY: "Evicted"}),
        "gpu-b": NodeInfo("gpu-b", "uid-b", True, {"pool": "gpu", KEY: "Ready"}),
    }
    previous = {"nodes": [ready_before("gpu-a"), ready_before("gpu-b")]}
    result = plan(observe(SPEC, nodes=nodes, previous=previous))
    states = {s["name"]: s for s in result.status["nodes"]}
    assert states["gpu-a"]["phase"] == "Evicted" and "remove the node label" in states["gpu-a"]["message"]
    assert result.labels == []  # Evicted stays (no pod selects it); Ready stays on gpu-b
    assert result.status["phase"] == "Ready" and "1 evicted" in condition(result, "Ready")["message"]
    assert ("Warning", "NodeCopyEvicted") in [e[:2] for e in result.events]

    everywhere = {n: NodeInfo(n, i.uid, True, {"pool": "gpu", KEY: "Evicted"}) for n, i in nodes.items()}
    result = plan(observe(SPEC, nodes=everywhere, previous=previous))
    assert result.status["phase"] == "Degraded" and condition(result, "Ready")["reason"] == "Evicted"


def test_an_evicted_copy_is_fetched_again_once_its_label_is_removed() -> None:
    evicted = {**ready_before("gpu-a"), "phase": "Evicted"}
    job = node_job("gpu-a")
    name = job["metadata"]["name"]
    nodes = {"gpu-a": NodeInfo("gpu-a", "uid-a", True, {"pool": "gpu", KEY: "Evicted"})}
    kept = plan(observe(SPEC, nodes=nodes, jobs={name: ended(job, succeeded=True)}, previous={"nodes": [evicted]}))
    assert kept.status["nodes"][0]["phase"] == "Evicted" and deleted(kept) == []

    cleared = {"gpu-a": NodeInfo("gpu-a", "uid-a", True, {"pool": "gpu"})}
    result = plan(observe(SPEC, nodes=cleared, jobs={name: ended(job, succeeded=True)}, previous={"nodes": [evicted]}))
    assert deleted(result) == [name] and result.status["nodes"][0]["phase"] == "Pending"

    result = plan(observe(SPEC, nodes=cleared, inputs_checked=True, previous={"nodes": [evicted]}))
    assert [a.key[1] for a in result.actions if a.verb == "apply"] == [name]
    assert result.status["nodes"][0]["phase"] == "Preloading"


def test_last_used_moves_while_pods_use_the_copy_but_not_on_every_reconcile() -> None:
    nodes = {"gpu-a": NodeInfo("gpu-a", "uid-a", True, {"pool": "gpu", KEY: "Ready"})}
    recent = ready_before("gpu-a", lastUsed="2025-12-31T23:55:00Z")
    result = plan(observe(SPEC, nodes=nodes, previous={"nodes": [recent]}, consumers_on={"gpu-a": 1}))
    assert result.status["nodes"][0]["lastUsed"] == "2025-12-31T23:55:00Z"
    result = plan(observe(SPEC, nodes=nodes, previous={"nodes": [ready_before("gpu-a")]}, consumers_on={"gpu-a": 1}))
    assert result.status["nodes"][0]["lastUsed"] == NOW.strftime("%Y-%m-%dT%H:%M:%SZ")
    idle = plan(observe(SPEC, nodes=nodes, previous={"nodes": [ready_before("gpu-a")]}))
    assert idle.status["nodes"][0]["lastUsed"] == "2025-12-31T00:00:00Z"


def test_copies_are_read_from_caches_status_and_consumers_from_bound_live_pods() -> None:
    def cache(name: str, *, pinned: bool = False, mode: str = "NodeLocal") -> dict[str, Any]:
        storage_spec: dict[str, Any] = {"mode": mode}
        if mode == "NodeLocal":
            storage_spec["nodeLocal"] = {"pinned": pinned}
        else:
            storage_spec["sharedPVC"] = {"size": "1Gi"}
        return {
            "metadata": {"namespace": "team", "name": name},
            "spec": {"source": {"uri": SOURCE}, "storage": storage_spec},
            "status": {
                "nodes": [
                    {"name": "gpu-a", "phase": "Ready", "lastUsed": "2025-12-01T00:00:00Z"},
                    {"name": "gpu-b", "phase": "Preloading"},
                ]
            },
        }

    def pod(cache_name: str, node: str | None, phase: str = "Running") -> dict[str, Any]:
        return {
            "metadata": {"namespace": "team", "labels": {"strata.dev/model-cache": cache_name}},
            "spec": {"nodeName": node} if node else {},
            "status": {"phase": phase},
        }

    copies = capacity.copies_from(
        [cache("a"), cache("b", pinned=True), cache("c", mode="SharedPVC")],
        [pod("a", "gpu-a"), pod("a", "gpu-a", "Succeeded"), pod("a", None), pod("b", "gpu-b")],
    )
    assert [(c.key, c.node, c.pinned, c.consumers, c.last_used) for c in copies] == [
        ("team/a", "gpu-a", False, 1, "2025-12-01T00:00:00Z"),
        ("team/b", "gpu-a", True, 0, "2025-12-01T00:00:00Z"),
    ]


def test_watermarks_out_of_order_are_refused_by_the_model() -> None:
    with pytest.raises(ValidationError, match="must be below highWatermark"):
        NodeCachePolicySpec(highWatermark=80, lowWatermark=80)
    with pytest.raises(ValidationError):
        NodeCachePolicySpec(highWatermark=101)
