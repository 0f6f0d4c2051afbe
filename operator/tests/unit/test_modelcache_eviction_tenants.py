"""Eviction between tenants, on plain observations: whose copies a cache's Job may evict (its own namespace's,
unless the NodeCachePolicy says otherwise), who pins (the policy; a cache's own `pinned` only within its
namespace), the per-namespace budget a Job carries, and an evicted copy coming back when a waiting pod needs it.
The filesystem side of the budget is tested for real in loader/tests/integration/test_node_capacity.py."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import ValidationError
from strata_operator.api.nodecachepolicy import NodeCachePolicySpec
from strata_operator.resources.modelcache import capacity, demand
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.plan import plan

from .test_modelcache_capacity_plan import KEY, NODES, POLICY, SPEC, budget_of, copy_on, created_jobs, node_job
from .test_modelcache_plan import OWNER, deleted, ended, observe

GiB = 2**30
OLD = "2025-11-01T00:00:00Z"
THEIRS = [
    copy_on("idle", namespace="team-a", last_used=OLD),
    copy_on("self-pinned", namespace="team-a", last_used=OLD, pinned=True),
    copy_on("kept", namespace="team-a", last_used=OLD),
]
OURS = [copy_on("old", last_used=OLD), copy_on("self-pinned", last_used=OLD, pinned=True)]


def given(spec: NodeCachePolicySpec, copies: list[capacity.CopyOnNode]):
    view = capacity.CapacityView([capacity.NodePolicy("nvme", spec)], copies)
    request = capacity.budget(view, OWNER, SPEC, NODES["gpu-a"])
    assert request is not None
    return request


def test_by_default_a_cache_evicts_only_copies_of_its_own_namespace_and_names_no_other_tenants_cache() -> None:
    request = given(POLICY.spec, THEIRS + OURS)
    assert request.candidates == ["serving/old"]
    assert request.protected == [
        "serving/self-pinned (pinned by its cache)",
        "3 copies of other namespaces (other namespaces are not evicted, NodeCachePolicy nvme)",
    ]
    assert not any("team-a" in p for p in request.protected)


def test_a_tenants_own_pin_does_not_keep_its_copy_from_other_namespaces_only_the_policys_pinned_list_does() -> None:
    across = POLICY.spec.model_copy(
        update={"evict_across_namespaces": True, "pinned": NodeCachePolicySpec(pinned=[PIN_KEPT]).pinned}
    )
    request = given(across, THEIRS + OURS)
    # team-a pinned its own copy: that keeps it from team-a's caches, not from ours
    assert request.candidates == ["serving/old", "team-a/idle", "team-a/self-pinned"]
    assert "serving/self-pinned (pinned by its cache)" in request.protected
    assert "1 copies of other namespaces (in use or pinned, NodeCachePolicy nvme)" in request.protected


PIN_KEPT = {"namespace": "team-a", "names": ["kept"]}


def test_the_policy_pins_whole_namespaces_or_named_caches_against_every_namespace() -> None:
    spec = NodeCachePolicySpec(
        evictAcrossNamespaces=True, pinned=[{"namespace": "team-a"}, {"namespace": "serving", "names": ["old"]}]
    )
    request = given(spec, THEIRS + OURS)
    assert request.candidates == []
    assert request.protected[0] == "serving/old (pinned by NodeCachePolicy nvme)"
    assert spec.pins("team-a", "anything") and not spec.pins("team-b", "kept")
    with pytest.raises(ValidationError):
        NodeCachePolicySpec(pinned=[{"namespace": "Team_A"}])


def test_the_namespace_budget_travels_with_the_job_and_a_namespace_entry_overrides_the_default() -> None:
    spec = NodeCachePolicySpec(namespaceBudget="100Gi", namespaceBudgets=[{"namespace": "serving", "maxBytes": "1Ti"}])
    assert given(spec, []).namespace_budget_bytes == 1024 * GiB
    assert spec.budget_of("team-a") == 100 * GiB
    assert given(NodeCachePolicySpec(namespaceBudget=0), []).namespace_budget_bytes == 0
    assert given(NodeCachePolicySpec(), []).namespace_budget_bytes is None
    with pytest.raises(ValidationError, match="fraction"):
        NodeCachePolicySpec(namespaceBudget="1.5Gi")


# -- an evicted copy coming back --------------------------------------------------------------------------
def waiting_pod(name: str, selector: dict[str, str] | None = None, **spec: Any) -> demand.WaitingPod:
    """A consumer pod as the webhook leaves it: gated, and required to land where this cache's copy is Ready."""
    affinity = {"matchExpressions": [{"key": KEY, "operator": "In", "values": ["Ready"]}, *spec.pop("more", [])]}
    body = {
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": selector or {},
            "schedulingGates": [{"name": "strata.dev/model-ready"}],
            "affinity": {
                "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [affinity]}}
            },
            **spec,
        },
        "status": {"phase": "Pending"},
    }
    pod = demand.WaitingPod.from_body(body)
    assert pod is not None
    return pod


def evicted_on(node: str, last_used: str = OLD) -> dict[str, Any]:
    job = node_job(node)["metadata"]["name"]
    return {"name": node, "job": job, "phase": "Evicted", "lastUsed": last_used, "message": "evicted"}


EVICTED_NODES = {n: NodeInfo(n, i.uid, True, {**i.labels, KEY: "Evicted"}) for n, i in NODES.items()}


def test_an_evicted_copy_stays_away_while_no_pod_waits_for_it() -> None:
    previous = {"nodes": [evicted_on("gpu-a"), evicted_on("gpu-b")]}
    result = plan(observe(SPEC, nodes=EVICTED_NODES, previous=previous, inputs_checked=True))
    assert [s["phase"] for s in result.status["nodes"]] == ["Evicted", "Evicted"] and result.actions == []
    assert "fetched again when a pod of this cache waits" in capacity.evicted_state({})["message"]


def test_a_waiting_pod_brings_back_one_evicted_copy_it_could_run_on_the_most_recently_used() -> None:
    previous = {"nodes": [evicted_on("gpu-a", "2025-12-01T00:00:00Z"), evicted_on("gpu-b", "2025-12-31T00:00:00Z")]}
    facts = {"nodes": EVICTED_NODES, "previous": previous, "waiting": [waiting_pod("vllm-0", {"pool": "gpu"})]}
    result = plan(observe(SPEC, inputs_checked=True, **facts))
    states = {s["name"]: s for s in result.status["nodes"]}
    assert (states["gpu-a"]["phase"], states["gpu-b"]["phase"]) == ("Evicted", "Preloading")
    assert list(created_jobs(result)) == ["gpu-b"]
    assert ("Normal", "CopyNeededAgain") in [e[:2] for e in result.events]
    assert "pod vllm-0 is waiting and could run on gpu-b" in " ".join(e[2] for e in result.events)

    first = plan(observe(SPEC, **facts))  # the references are read before a Job is created
    assert first.needs_inputs


def test_the_evicted_copys_old_job_goes_first_and_the_new_one_carries_the_nodes_budget() -> None:
    job = node_job("gpu-a")
    name = job["metadata"]["name"]
    nodes = {"gpu-a": EVICTED_NODES["gpu-a"]}
    previous = {"nodes": [evicted_on("gpu-a")]}
    pods = [waiting_pod("vllm-0")]
    result = plan(observe(SPEC, nodes=nodes, previous=previous, waiting=pods, jobs={name: ended(job, succeeded=True)}))
    assert deleted(result) == [name] and result.status["nodes"][0]["phase"] == "Pending"

    view = capacity.CapacityView([POLICY], [copy_on("old", last_used=OLD)])
    again = plan(observe(SPEC, nodes=nodes, previous=result.status, waiting=pods, inputs_checked=True, capacity=view))
    request = budget_of(created_jobs(again)["gpu-a"])
    assert request is not None and request.candidates == ["serving/old"]


@pytest.mark.parametrize(
    ("pod", "why"),
    [
        (waiting_pod("elsewhere", {"pool": "cpu"}), "its nodeSelector excludes every node"),
        (
            waiting_pod("not-a", more=[{"key": "disk", "operator": "DoesNotExist"}], nodeName=""),
            "affinity excludes gpu-a",
        ),
    ],
)
def test_a_waiting_pod_that_could_not_run_on_the_node_brings_nothing_back(pod: demand.WaitingPod, why: str) -> None:
    nodes = {"gpu-a": EVICTED_NODES["gpu-a"]}
    result = plan(
        observe(SPEC, nodes=nodes, previous={"nodes": [evicted_on("gpu-a")]}, waiting=[pod], inputs_checked=True)
    )
    assert result.status["nodes"][0]["phase"] == "Evicted" and result.actions == [], why


def test_a_waiting_pod_that_could_run_where_a_copy_is_brings_nothing_back() -> None:
    nodes = {"gpu-a": EVICTED_NODES["gpu-a"], "gpu-b": NodeInfo("gpu-b", "uid-b", True, {"pool": "gpu", KEY: "Ready"})}
    ready = {"name": "gpu-b", "job": node_job("gpu-b")["metadata"]["name"], "phase": "Ready", "bytes": 1, "files": 1}
    previous = {"nodes": [evicted_on("gpu-a"), ready]}
    result = plan(observe(SPEC, nodes=nodes, previous=previous, waiting=[waiting_pod("vllm-0")], inputs_checked=True))
    assert {s["name"]: s["phase"] for s in result.status["nodes"]} == {"gpu-a": "Evicted", "gpu-b": "Ready"}
    assert result.actions == []


def test_only_pods_that_have_not_started_wait_and_node_affinity_is_read_as_the_scheduler_reads_it() -> None:
    assert demand.WaitingPod.from_body({"metadata": {"name": "x"}, "status": {"phase": "Running"}}) is None
    gone = {"metadata": {"name": "x", "deletionTimestamp": "2026-01-01T00:00:00Z"}, "status": {"phase": "Pending"}}
    assert demand.WaitingPod.from_body(gone) is None
    node = NodeInfo("gpu-a", "u", True, {"gpus": "8", "zone": "z1"})
    terms = [
        {
            "matchExpressions": [
                {"key": "gpus", "operator": "Gt", "values": ["4"]},
                {"key": "zone", "operator": "NotIn", "values": ["z2"]},
            ]
        },
    ]
    assert demand.WaitingPod("p", terms=terms).could_run_on(node)
    assert not demand.WaitingPod(
        "p", terms=[{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["gpu-b"]}]}]
    ).could_run_on(node)
    assert demand.WaitingPod("p", node_name="gpu-a").could_run_on(node)
    assert not demand.WaitingPod("p", node_name="gpu-b", node_selector={"zone": "z1"}).could_run_on(node)
