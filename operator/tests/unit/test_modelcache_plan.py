"""The ModelCache plan, storage mode by storage mode, on plain observations: no cluster, no fakes of the API.

Each case builds what a gather would have read (a claim, Jobs, their pods, nodes) and asserts on what the plan
decides: the objects to apply and delete, the node labels, the status and the Events.
"""

from __future__ import annotations

import datetime
from typing import Any

from strata_loader.contract import FetchResult
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.core import Problem
from strata_operator.resources.modelcache import names, storage
from strata_operator.resources.modelcache.draft import LabelChange, Plan
from strata_operator.resources.modelcache.jobs import CONTAINER
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.observed import Observed
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.plan import plan

OWNER = CacheRef(name="llama", namespace="serving", uid="cache-uid", generation=3)
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
SOURCE = "s3://models/llama"


def spec_of(storage_spec: dict[str, Any], **source: Any) -> ModelCacheSpec:
    return ModelCacheSpec.model_validate({"source": {"uri": SOURCE, **source}, "storage": storage_spec})


SHARED = spec_of({"mode": "SharedPVC", "sharedPVC": {"size": "10Gi"}})
NODE_LOCAL = spec_of({"mode": "NodeLocal", "nodeLocal": {"nodeSelector": {"pool": "gpu"}}})


def observe(spec: ModelCacheSpec, **facts: Any) -> Observed:
    return Observed(owner=OWNER, previous=facts.pop("previous", {}), now=NOW, spec=spec, **facts)


def our_claim(uid: str = "claim-uid") -> dict[str, Any]:
    claim = storage.build_claim(OWNER, SHARED)
    claim["metadata"]["uid"] = uid
    return claim


def ended(job: dict[str, Any], *, succeeded: bool) -> dict[str, Any]:
    kind = "Complete" if succeeded else "Failed"
    return {**job, "status": {"conditions": [{"type": kind, "status": "True", "reason": "BackoffLimitExceeded"}]}}


def pod_with_result(result: FetchResult, *, phase: str = "Succeeded") -> dict[str, Any]:
    terminated = {"terminated": {"message": result.to_termination_message()}}
    return {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": phase, "containerStatuses": [{"name": CONTAINER, "state": terminated}]},
    }


def condition(result: Plan, type_: str) -> dict[str, Any]:
    return next(c for c in result.status["conditions"] if c["type"] == type_)


def applied(result: Plan) -> list[tuple[str, str]]:
    return [a.key for a in result.actions if a.verb == "apply"]


def deleted(result: Plan) -> list[str]:
    return [a.key[1] for a in result.actions if a.verb == "delete"]


def reasons(result: Plan) -> list[str]:
    return [reason for _, reason, _ in result.events] + [a.event[1] for a in result.actions if a.event]


# -- SharedPVC ----------------------------------------------------------------------------------------------
def test_shared_pvc_creates_its_claim_first_and_plans_again_for_the_job() -> None:
    result = plan(observe(SHARED))
    assert applied(result) == [("PersistentVolumeClaim", "llama-model")]
    assert result.again and "ClaimCreated" in reasons(result)
    assert result.status["phase"] == "Preloading" and "job" not in result.status


def test_a_new_job_waits_for_its_references_to_be_checked() -> None:
    result = plan(observe(SHARED, claim=our_claim()))
    assert result.needs_inputs

    result = plan(observe(SHARED, claim=our_claim(), inputs_checked=True))
    (kind, job_name), *_ = applied(result)
    assert kind == "Job" and result.status["job"] == job_name and result.status["phase"] == "Preloading"
    assert "PreloadStarted" in reasons(result) and not result.needs_inputs


def test_a_missing_secret_blocks_the_job_with_a_condition() -> None:
    problem = Problem("SecretNotFound", "Secret 's3' (source.credentials.secretRef) does not exist")
    result = plan(observe(SHARED, claim=our_claim(), inputs_checked=True, input_problem=problem))
    assert applied(result) == []
    assert condition(result, "Ready")["reason"] == "SecretNotFound"
    assert ("Warning", "SecretNotFound", problem.message) in result.events


def test_a_refused_job_says_what_the_api_server_said() -> None:
    first = plan(observe(SHARED, claim=our_claim(), inputs_checked=True))
    job_key = applied(first)[0]
    observed = observe(SHARED, claim=our_claim(), inputs_checked=True, rejected={job_key: "exceeded quota: jobs"})
    result = plan(observed)
    assert applied(result) == [] and result.status["phase"] == "Failed"
    ready = condition(result, "Ready")
    assert ready["reason"] == "JobRejected" and "exceeded quota: jobs" in ready["message"]


def test_a_succeeded_job_with_a_verified_result_makes_the_cache_ready() -> None:
    _, job = storage.shared_pvc_preload(OWNER, SHARED, "claim-uid")
    name = job["metadata"]["name"]
    result_json = FetchResult(source=SOURCE, revision="abc", bytes=2048, files=3, seconds=1.5)
    observed = observe(
        SHARED,
        claim=our_claim(),
        jobs={name: ended(job, succeeded=True)},
        pods={name: [pod_with_result(result_json)]},
        previous={"job": name, "phase": "Preloading"},
    )
    result = plan(observed)
    assert result.status["phase"] == "Ready" and result.actions == []
    assert (result.status["totalBytes"], result.status["totalFiles"], result.status["resolvedRevision"]) == (
        2048,
        3,
        "abc",
    )
    assert result.status["claimUid"] == "claim-uid" and ("Normal", "Preloaded") in [e[:2] for e in result.events]


def test_a_result_for_another_source_is_not_trusted() -> None:
    _, job = storage.shared_pvc_preload(OWNER, SHARED, "claim-uid")
    name = job["metadata"]["name"]
    wrong = FetchResult(source="s3://models/other", bytes=1, files=1)
    observed = observe(
        SHARED,
        claim=our_claim(),
        jobs={name: ended(job, succeeded=True)},
        pods={name: [pod_with_result(wrong)]},
        previous={"job": name},
    )
    result = plan(observed)
    ready = condition(result, "Ready")
    assert result.status["phase"] == "Failed" and ready["reason"] == "ResultUnverified"
    assert "s3://models/other" in ready["message"]


def test_a_job_created_just_before_a_crash_still_gets_its_start_event() -> None:
    """Status never named the Job (the operator died between creating it and writing status)."""
    _, job = storage.shared_pvc_preload(OWNER, SHARED, "claim-uid")
    name = job["metadata"]["name"]
    result = plan(observe(SHARED, claim=our_claim(), jobs={name: job}))
    assert applied(result) == [] and result.status["job"] == name
    assert [e for e in result.events if e[1] == "PreloadStarted"] == [
        ("Normal", "PreloadStarted", f"Job {name} copies {SOURCE} into llama-model")
    ]
    again = plan(observe(SHARED, claim=our_claim(), jobs={name: job}, previous=result.status))
    assert "PreloadStarted" not in reasons(again)  # once


def test_a_changed_request_supersedes_the_old_job() -> None:
    stale = {"kind": "Job", "metadata": {"name": "llama-preload-old"}}
    result = plan(observe(SHARED, claim=our_claim(), jobs={"llama-preload-old": stale}, inputs_checked=True))
    assert deleted(result) == ["llama-preload-old"] and "PreloadSuperseded" in reasons(result)
    assert applied(result)[0][0] == "Job"


def test_a_missing_storage_class_is_named() -> None:
    spec = spec_of({"mode": "SharedPVC", "sharedPVC": {"size": "1Gi", "storageClassName": "fast-rwx"}})
    result = plan(observe(spec, storage_class_missing=True))
    assert applied(result) == []
    ready = condition(result, "Ready")
    assert ready["reason"] == "StorageClassNotFound" and "'fast-rwx'" in ready["message"]


# -- NodeLocal ----------------------------------------------------------------------------------------------
NODES = {
    "gpu-a": NodeInfo("gpu-a", "uid-a", True, {"pool": "gpu"}),
    "gpu-b": NodeInfo("gpu-b", "uid-b", True, {"pool": "gpu"}),
    "gpu-down": NodeInfo("gpu-down", "uid-d", False, {"pool": "gpu"}),
    "cpu-a": NodeInfo("cpu-a", "uid-c", True, {"pool": "cpu"}),
}


EACH_FROM_SOURCE = spec_of(
    {"mode": "NodeLocal", "nodeLocal": {"nodeSelector": {"pool": "gpu"}, "fanOut": {"enabled": False}}}
)


def node_job(node: str, spec: ModelCacheSpec = NODE_LOCAL) -> dict[str, Any]:
    return storage.node_preload(OWNER, spec, node, NODES[node].uid)[1]


def test_without_fan_out_every_selected_ready_node_gets_a_pinned_job_at_once() -> None:
    result = plan(observe(EACH_FROM_SOURCE, nodes=NODES, inputs_checked=True))
    assert applied(result) == [
        ("Job", node_job("gpu-a", EACH_FROM_SOURCE)["metadata"]["name"]),
        ("Job", node_job("gpu-b", EACH_FROM_SOURCE)["metadata"]["name"]),
    ]
    assert "fanOut" not in result.status
    assert [n["name"] for n in result.status["nodes"]] == ["gpu-a", "gpu-b"]
    assert result.status["phase"] == "Preloading" and result.status["desiredNodes"] == 2
    assert result.labels == []


def test_a_verified_copy_labels_its_node_and_an_unselected_label_goes() -> None:
    key = names.node_label_key(OWNER.namespace, OWNER.name)
    nodes = {**NODES, "cpu-a": NodeInfo("cpu-a", "uid-c", True, {"pool": "cpu", key: "Ready"})}
    job_a, job_b = node_job("gpu-a"), node_job("gpu-b")
    copied = FetchResult(source=SOURCE, revision="r1", bytes=4096, files=2, seconds=2.0)
    observed = observe(
        NODE_LOCAL,
        nodes=nodes,
        jobs={job_a["metadata"]["name"]: ended(job_a, succeeded=True), job_b["metadata"]["name"]: job_b},
        pods={job_a["metadata"]["name"]: [pod_with_result(copied)]},
        previous={"nodes": [{"name": "gpu-a", "job": job_a["metadata"]["name"], "phase": "Preloading"}]},
    )
    result = plan(observed)
    assert result.labels == [LabelChange("cpu-a", key, None), LabelChange("gpu-a", key, "Ready")]
    states = {s["name"]: s for s in result.status["nodes"]}
    assert states["gpu-a"]["phase"] == "Ready" and states["gpu-a"]["bytes"] == 4096
    assert "revision" not in states["gpu-a"] and result.status["resolvedRevision"] == "r1"
    assert result.status["readyNodes"] == 1 and result.status["totalBytes"] == 4096
    assert ("Normal", "NodeReady") in [e[:2] for e in result.events]


def test_a_failed_node_copy_degrades_the_cache_with_the_reason() -> None:
    job_a = node_job("gpu-a")
    name = job_a["metadata"]["name"]
    broken = FetchResult(status="Failed", error="403 Forbidden on s3://models/llama", source=SOURCE)
    nodes = {"gpu-a": NODES["gpu-a"]}
    observed = observe(
        NODE_LOCAL,
        nodes=nodes,
        jobs={name: ended(job_a, succeeded=False)},
        pods={name: [pod_with_result(broken, phase="Failed")]},
        previous={"nodes": [{"name": "gpu-a", "job": name, "phase": "Preloading"}]},
    )
    result = plan(observed)
    degraded = condition(result, "Degraded")
    assert result.status["phase"] == "Failed" and degraded["status"] == "True"
    assert "403 Forbidden" in degraded["message"] and ("Warning", "NodePreloadFailed") in [e[:2] for e in result.events]


def test_no_matching_node_is_pending_with_the_selector_in_the_message() -> None:
    result = plan(observe(NODE_LOCAL, nodes={"cpu-a": NODES["cpu-a"]}))
    ready = condition(result, "Ready")
    assert result.status["phase"] == "Pending" and ready["reason"] == "NoMatchingNodes"
    assert "{'pool': 'gpu'}" in ready["message"] and result.actions == []


def test_jobs_of_nodes_no_longer_selected_are_deleted() -> None:
    gone = storage.node_preload(OWNER, NODE_LOCAL, "cpu-a", "uid-c")[1]
    name = gone["metadata"]["name"]
    result = plan(observe(NODE_LOCAL, nodes=NODES, jobs={name: gone}, inputs_checked=True))
    assert deleted(result) == [name]


def test_a_spec_problem_found_while_gathering_is_all_the_plan_reports() -> None:
    observed = Observed(owner=OWNER, previous={}, now=NOW, spec_problem=Problem("InvalidSpec", "spec.x: bad"))
    result = plan(observed)
    assert result.actions == [] and condition(result, "Ready")["reason"] == "InvalidSpec"


def test_consumers_come_from_the_daemons_count_and_an_unknown_count_keeps_the_stored_one() -> None:
    """status.consumers has one writer, the reconcile: the plan puts the count the daemon's pod index gave."""
    spec = spec_of({"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}})
    assert plan(observe(spec, claim=our_claim(), consumers=4)).status["consumers"] == 4
    assert plan(observe(spec, claim=our_claim(), consumers=0, previous={"consumers": 4})).status["consumers"] == 0
    assert plan(observe(spec, claim=our_claim(), previous={"consumers": 2})).status["consumers"] == 2
    assert "consumers" not in plan(observe(spec, claim=our_claim())).status
