"""A node that stops being Ready while it holds a copy or preloads one, and its return (`node_loss`)."""

from __future__ import annotations

from typing import Any

from strata_loader.contract import FetchResult
from strata_operator.resources.core import node_not_ready
from strata_operator.resources.modelcache import names
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.plan import plan

from .test_modelcache_plan import EACH_FROM_SOURCE, OWNER, SOURCE, condition, deleted, ended, node_job, observe
from .test_modelcache_plan import pod_with_result as with_result

KEY = names.node_label_key(OWNER.namespace, OWNER.name)
WHY = "NodeStatusUnknown: Kubelet stopped posting node status. (since 2026-01-01T00:00:00Z)"
UP = {
    "gpu-a": NodeInfo("gpu-a", "uid-a", True, {"pool": "gpu", KEY: "Ready"}),
    "gpu-b": NodeInfo("gpu-b", "uid-b", True, {"pool": "gpu", KEY: "Ready"}),
}
B_DOWN = {**UP, "gpu-b": NodeInfo("gpu-b", "uid-b", False, {"pool": "gpu", KEY: "Ready"}, not_ready=WHY)}
JOB_A, JOB_B = (node_job(n, EACH_FROM_SOURCE)["metadata"]["name"] for n in ("gpu-a", "gpu-b"))


def ready_state(node: str, job: str) -> dict[str, Any]:
    return {"name": node, "job": job, "phase": "Ready", "bytes": 4096, "files": 2, "message": "verified copy: 2 files"}


def event_reasons(result: Any) -> list[tuple[str, str]]:
    return [e[:2] for e in result.events]


def test_why_a_node_is_not_ready_comes_from_its_own_ready_condition() -> None:
    unknown = {
        "type": "Ready",
        "status": "Unknown",
        "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    assert node_not_ready({"status": {"conditions": [unknown]}}) == WHY
    assert node_not_ready({"status": {"conditions": [{**unknown, "status": "True"}]}}) is None
    assert node_not_ready({"status": {}}) == "the node has not reported a Ready condition yet"
    assert NodeInfo.from_body({"metadata": {"name": "n"}, "status": {"conditions": [unknown]}}).not_ready == WHY


def test_a_ready_copy_on_a_node_that_stops_being_ready_is_kept_labelled_and_named_in_status() -> None:
    previous = {"nodes": [ready_state("gpu-a", JOB_A), ready_state("gpu-b", JOB_B)], "readyNodes": 2}
    result = plan(observe(EACH_FROM_SOURCE, nodes=B_DOWN, previous=previous, inputs_checked=True))
    states = {s["name"]: s for s in result.status["nodes"]}
    lost = states["gpu-b"]
    assert lost["phase"] == "NodeNotReady" and lost["job"] == JOB_B and lost["bytes"] == 4096
    assert lost["beforeNodeLoss"] == {"phase": "Ready", "message": "verified copy: 2 files"}
    assert WHY in lost["message"] and "kept" in lost["message"]
    assert result.labels == []  # both labels stay: the copy on gpu-b serves again when it returns
    assert result.actions == []  # nothing deleted, nothing created
    # Usable on gpu-a, but Degraded and Reconciling (kstatus: InProgress) naming gpu-b, until it returns.
    assert (
        condition(result, "Ready")["status"] == "True" and "not Ready: gpu-b" in condition(result, "Ready")["message"]
    )
    assert (
        condition(result, "Degraded")["reason"] == "NodeNotReady"
        and "gpu-b" in condition(result, "Degraded")["message"]
    )
    assert condition(result, "Reconciling")["status"] == "True" and condition(result, "Stalled")["status"] == "False"
    assert result.status["phase"] == "Degraded" and result.status["readyNodes"] == 1
    assert ("Warning", "NodeNotReady") in event_reasons(result)
    # One per node (the Degraded condition's own Event names the first only).
    [message] = [m for _, r, m in result.events if r == "NodeNotReady" and m.startswith("node ")]
    assert message.startswith("node gpu-b: ") and WHY in message


def test_a_preload_on_a_node_that_stops_being_ready_keeps_its_job() -> None:
    previous = {"nodes": [ready_state("gpu-a", JOB_A), {"name": "gpu-b", "job": JOB_B, "phase": "Preloading"}]}
    running = node_job("gpu-b", EACH_FROM_SOURCE)
    result = plan(
        observe(EACH_FROM_SOURCE, nodes=B_DOWN, previous=previous, jobs={JOB_B: running}, inputs_checked=True)
    )
    lost = {s["name"]: s for s in result.status["nodes"]}["gpu-b"]
    assert lost["phase"] == "NodeNotReady" and lost["beforeNodeLoss"] == {"phase": "Preloading"}
    assert "resumes when the node returns" in lost["message"]
    assert deleted(result) == []
    # gpu-b had no copy yet: it does not get the label.
    assert [(c.node, c.value) for c in result.labels] == [("gpu-b", None)]


def test_a_returning_node_resumes_where_it_was() -> None:
    previous_down = {"nodes": [ready_state("gpu-a", JOB_A), ready_state("gpu-b", JOB_B)]}
    down = plan(observe(EACH_FROM_SOURCE, nodes=B_DOWN, previous=previous_down, inputs_checked=True)).status
    back = plan(observe(EACH_FROM_SOURCE, nodes=UP, previous=down, inputs_checked=True))
    states = {s["name"]: s for s in back.status["nodes"]}
    assert states["gpu-b"] == ready_state("gpu-b", JOB_B) | {"lastUsed": states["gpu-b"]["lastUsed"]}
    assert back.status["phase"] == "Ready" and back.status["readyNodes"] == 2
    assert condition(back, "Degraded")["status"] == "False" and condition(back, "Reconciling")["status"] == "False"
    assert back.actions == [] and back.labels == []  # no new Job: the copy was kept
    [(kind, message)] = [(k, m) for k, r, m in back.events if r == "NodeReturned"]
    assert kind == "Normal" and message == "node gpu-b is Ready again; its copy: Ready: verified copy: 2 files"


def test_a_preload_whose_node_returns_is_read_from_its_job_again() -> None:
    previous = {"nodes": [ready_state("gpu-a", JOB_A), {"name": "gpu-b", "job": JOB_B, "phase": "Preloading"}]}
    job_b = node_job("gpu-b", EACH_FROM_SOURCE)
    down = plan(observe(EACH_FROM_SOURCE, nodes=B_DOWN, previous=previous, jobs={JOB_B: job_b})).status
    copied = FetchResult(source=SOURCE, revision="r1", bytes=4096, files=2, seconds=2.0)
    back = plan(
        observe(
            EACH_FROM_SOURCE,
            nodes=UP,
            previous=down,
            jobs={JOB_B: ended(job_b, succeeded=True)},
            pods={JOB_B: [with_result(copied)]},
        )
    )
    assert {s["name"]: s["phase"] for s in back.status["nodes"]} == {"gpu-a": "Ready", "gpu-b": "Ready"}
    assert ("Normal", "NodeReturned") in event_reasons(back)


def test_every_selected_node_lost_is_not_ready_but_waits_rather_than_stalls() -> None:
    all_down = {n: NodeInfo(n, i.uid, False, i.labels, not_ready=WHY) for n, i in UP.items()}
    previous = {"nodes": [ready_state("gpu-a", JOB_A), ready_state("gpu-b", JOB_B)]}
    result = plan(observe(EACH_FROM_SOURCE, nodes=all_down, previous=previous))
    assert result.status["phase"] == "Degraded" and result.status["desiredNodes"] == 2
    assert condition(result, "Ready")["status"] == "False" and condition(result, "Ready")["reason"] == "NodeNotReady"
    assert condition(result, "Reconciling")["status"] == "True" and condition(result, "Stalled")["status"] == "False"


def test_a_node_that_was_never_planned_for_is_not_lost_and_a_deleted_node_is_forgotten() -> None:
    fresh_down = {"gpu-a": UP["gpu-a"], "gpu-c": NodeInfo("gpu-c", "uid-c", False, {"pool": "gpu"}, not_ready=WHY)}
    previous = {"nodes": [ready_state("gpu-a", JOB_A)]}
    result = plan(observe(EACH_FROM_SOURCE, nodes=fresh_down, previous=previous))
    assert [s["name"] for s in result.status["nodes"]] == ["gpu-a"] and result.status["phase"] == "Ready"
    down = plan(
        observe(
            EACH_FROM_SOURCE,
            nodes=B_DOWN,
            previous={"nodes": [ready_state("gpu-a", JOB_A), ready_state("gpu-b", JOB_B)]},
        )
    ).status
    job_b = node_job("gpu-b", EACH_FROM_SOURCE)
    gone = plan(observe(EACH_FROM_SOURCE, nodes={"gpu-a": UP["gpu-a"]}, previous=down, jobs={JOB_B: job_b}))
    assert [s["name"] for s in gone.status["nodes"]] == ["gpu-a"] and deleted(gone) == [JOB_B]
