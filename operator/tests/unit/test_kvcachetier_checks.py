"""Bad input the API server cannot catch, and the status computed from what the cluster reports."""

from __future__ import annotations

from typing import Any

import pytest
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.conditions import transition_events
from strata_operator.resources.core import Problem, status_patch
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.observed import Observed
from strata_operator.resources.kvcachetier.status import STARTUP_GRACE_SECONDS, Checked, compute_status, endpoints
from strata_operator.resources.kvcachetier.validation import (
    ClusterFacts,
    node_selected,
    nodes_too_small,
    validate,
)
from strata_testsupport.status import check_status

TIER = TierRef("kv", "serving", "uid", 2)
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
T0, T1 = "2026-01-01T00:00:00Z", "2026-01-01T00:05:00Z"


def spec_of(**fields: Any) -> KVCacheTierSpec:
    return KVCacheTierSpec.model_validate(fields)


def node(name: str, memory: str = "64Gi", taints: list[dict[str, str]] | None = None, **labels: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": labels},
        "spec": {"taints": taints or []},
        "status": {"allocatable": {"memory": memory}},
    }


def status_of(
    spec: KVCacheTierSpec,
    daemonset: dict[str, Any] | None = None,
    pods: list[dict[str, Any]] | tuple[()] = (),
    *,
    previous: dict[str, Any] | None = None,
    now: str = T0,
    claim: dict[str, Any] | None = None,
    problems: list[Problem] | tuple[()] | None = (),
    config_hash: str | None = None,
) -> dict[str, Any]:
    """The status rendered from an observation (what gather read) and a verdict (what the plan concluded)."""
    observed = Observed(TIER, previous=previous or {}, now=now, daemonset=daemonset, pods=pods, claim=claim)
    return compute_status(spec, observed, Checked(problems=problems, config_hash=config_hash))


def events_of(previous: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, str, str]]:
    return transition_events("KVCacheTier", previous.get("conditions") or [], new["conditions"])


def reasons(problems: list[Problem]) -> list[str]:
    return [p.reason for p in problems]


def test_tainted_gpu_nodes_need_a_toleration() -> None:
    gpu = node("gpu-0", taints=[GPU_TAINT], gpu="true")
    assert not node_selected(spec_of(nodeSelector={"gpu": "true"}), gpu)
    tolerate = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert node_selected(spec_of(nodeSelector={"gpu": "true"}, tolerations=tolerate), gpu)
    assert not node_selected(spec_of(nodeSelector={"gpu": "false"}, tolerations=tolerate), gpu)
    by_value = [{"key": "nvidia.com/gpu", "operator": "Equal", "value": "absent"}]
    assert not node_selected(spec_of(tolerations=by_value), gpu)
    assert node_selected(spec_of(tolerations=[{"operator": "Exists"}]), gpu)


def test_node_condition_taints_are_tolerated_by_daemonsets_anyway() -> None:
    taint = {"key": "node.kubernetes.io/unschedulable", "effect": "NoSchedule"}
    assert node_selected(spec_of(), node("n", taints=[taint]))


def test_l1_larger_than_every_node_is_invalid_with_a_clear_reason() -> None:
    facts = ClusterFacts(nodes=[node("a", "16Gi"), node("b", "32Gi")])
    problems = validate(spec_of(l1={"size": "40Gi"}), facts)
    assert reasons(problems) == ["L1ExceedsNodeMemory"]
    assert "41Gi" in problems[0].message and "32Gi" in problems[0].message
    assert validate(spec_of(l1={"size": "20Gi"}), facts) == []
    assert nodes_too_small(spec_of(l1={"size": "20Gi"}), facts.nodes) == ["a"]


def test_no_selected_node_is_not_a_config_error() -> None:
    assert validate(spec_of(l1={"size": "1Ti"}), ClusterFacts()) == []


def test_missing_secrets_and_keys() -> None:
    spec = spec_of(
        auth={"secretRef": {"name": "token"}},
        l2={"s3": {"bucket": "kvc", "endpoint": "http://s3", "secretRef": {"name": "s3"}}},
    )
    assert reasons(validate(spec, ClusterFacts(secrets={"token": None, "s3": None}))) == [
        "SecretNotFound",
        "SecretNotFound",
    ]
    facts = ClusterFacts(secrets={"token": {"password": "x"}, "s3": {"AWS_ACCESS_KEY_ID": "x"}})
    problems = validate(spec, facts)
    assert reasons(problems) == ["SecretKeyMissing", "S3CredentialsIncomplete"]
    assert "AWS_SECRET_ACCESS_KEY" in problems[1].message
    ok = ClusterFacts(secrets={"token": {"token": "x"}, "s3": {"AWS_ACCESS_KEY_ID": "", "AWS_SECRET_ACCESS_KEY": ""}})
    assert validate(spec, ok) == []


def test_existing_claim_must_exist_and_be_read_write_many() -> None:
    spec = spec_of(l2={"fs": {"pvc": {"claimName": "data"}}})
    assert reasons(validate(spec, ClusterFacts(claim_checked=True))) == ["PVCNotFound"]
    rwo = {"spec": {"accessModes": ["ReadWriteOnce"]}}
    problems = validate(spec, ClusterFacts(existing_claim=rwo, claim_checked=True))
    assert reasons(problems) == ["PVCNotReadWriteMany"]
    assert "ReadWriteMany" in problems[0].message
    rwx = {"spec": {"accessModes": ["ReadWriteMany"]}}
    assert validate(spec, ClusterFacts(existing_claim=rwx, claim_checked=True)) == []


def daemonset(desired: int, ready: int, updated: int | None = None, settled: bool = True) -> dict[str, Any]:
    return {
        "metadata": {"generation": 4},
        "status": {
            "desiredNumberScheduled": desired,
            "numberReady": ready,
            "updatedNumberScheduled": desired if updated is None else updated,
            "observedGeneration": 4 if settled else 3,
        },
    }


def pod(name: str, node_name: str, ready: bool, ip: str | None = "10.0.0.1") -> dict[str, Any]:
    status: dict[str, Any] = {"conditions": [{"type": "Ready", "status": "True" if ready else "False"}]}
    if ip:
        status["podIP"] = ip
    return {"metadata": {"name": name}, "spec": {"nodeName": node_name}, "status": status}


def conditions_of(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    check_status("KVCacheTier", status)  # every status these tests compute fits the model the CRD comes from
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def test_all_ready() -> None:
    pods = [pod("kv-b", "n2", True, "10.0.0.2"), pod("kv-a", "n1", True)]
    status = status_of(spec_of(), daemonset(2, 2), pods, config_hash="abc", now=T0)
    check_status("KVCacheTier", status)
    assert (status["desiredInstances"], status["readyInstances"]) == (2, 2)
    assert status["configHash"] == "abc" and status["l2"] == "none"
    assert [e["node"] for e in status["endpoints"]] == ["n1", "n2"]
    assert status["endpoints"][0]["address"] == "10.0.0.1:6379"
    conditions = conditions_of(status)
    assert conditions["Available"] == ("True", "InstancesServing")
    assert conditions["AllInstancesReady"] == ("True", "AllReady")
    assert conditions["ConfigValid"] == ("True", "Valid")
    assert conditions["L2Reachable"] == ("True", "NotConfigured")
    assert conditions["Ready"] == ("True", "AllReady")
    assert conditions["Reconciling"] == ("False", "Settled")
    assert conditions["Stalled"] == ("False", "Valid")
    assert all(c["observedGeneration"] == 2 for c in status["conditions"])


def test_partial_readiness_and_rollout() -> None:
    conditions = conditions_of(status_of(spec_of(), daemonset(3, 1), now=T0))
    assert conditions["Available"] == ("True", "InstancesServing")
    assert conditions["AllInstancesReady"] == ("False", "InstancesNotReady")
    rolling = conditions_of(status_of(spec_of(), daemonset(3, 3, updated=1), now=T0))
    assert rolling["AllInstancesReady"] == ("False", "RollingOut")
    assert rolling["Reconciling"] == ("True", "RollingOut")
    unsettled = conditions_of(status_of(spec_of(), daemonset(3, 3, settled=False), now=T0))
    assert unsettled["AllInstancesReady"] == ("False", "RollingOut")


def test_no_matching_nodes_and_invalid_config() -> None:
    empty = conditions_of(status_of(spec_of(), daemonset(0, 0), now=T0))
    assert empty["Available"] == ("False", "NoMatchingNodes")
    problem = Problem("SecretNotFound", "Secret 'x' does not exist")
    invalid = status_of(spec_of(), problems=[problem], now=T0)
    conditions = conditions_of(invalid)
    assert conditions["ConfigValid"] == ("False", "SecretNotFound")
    assert conditions["Ready"] == ("False", "SecretNotFound")
    assert conditions["Available"] == ("False", "ConfigInvalid")
    assert conditions["Stalled"] == ("True", "SecretNotFound")
    assert conditions["Reconciling"] == ("False", "Settled")


def test_l2_claim_must_be_bound() -> None:
    spec = spec_of(l2={"fs": {"pvc": {"create": {"size": "1Ti"}}}})
    pending = {"status": {"phase": "Pending"}}
    status = status_of(spec, daemonset(1, 1), claim=pending, now=T0)
    assert conditions_of(status)["L2Reachable"] == ("False", "PVCNotBound")
    bound = {"status": {"phase": "Bound"}}
    status = status_of(spec, daemonset(1, 1), claim=bound, now=T0)
    assert conditions_of(status)["L2Reachable"] == ("True", "ServersReady")
    assert status["l2"] == "fs"


def test_recomputing_an_unchanged_status_needs_no_write() -> None:
    seen = (daemonset(2, 2), [pod("kv-a", "n1", True)])
    first = status_of(spec_of(), *seen, now=T0)
    second = status_of(spec_of(), *seen, previous=first, now=T1)
    assert status_patch(first, second) is None
    assert events_of(first, second) == []


def test_transition_time_moves_only_when_a_condition_flips() -> None:
    first = status_of(spec_of(), daemonset(2, 1), now=T0)
    second = status_of(spec_of(), daemonset(2, 2), previous=first, now=T1)
    times = {c["type"]: c["lastTransitionTime"] for c in second["conditions"]}
    assert times["Available"] == T0
    assert times["AllInstancesReady"] == T1
    assert events_of(first, second) == [("Normal", "AllReady", "all 2 servers are ready")]


def test_broken_configuration_is_a_warning_event() -> None:
    first = status_of(spec_of(), daemonset(2, 2), now=T0)
    problem = Problem("SecretNotFound", "Secret 'x' does not exist")
    second = status_of(spec_of(), daemonset(2, 2), problems=[problem], previous=first, now=T1)
    assert ("Warning", "SecretNotFound", "Secret 'x' does not exist") in events_of(first, second)


def test_status_only_refresh_keeps_the_last_validation() -> None:
    problem = Problem("L1ExceedsNodeMemory", "too big")
    first = status_of(spec_of(), daemonset(2, 1), problems=[problem], now=T0)
    refreshed = status_of(spec_of(), daemonset(2, 2), problems=None, previous=first, now=T1)
    assert conditions_of(refreshed)["ConfigValid"] == ("False", "L1ExceedsNodeMemory")
    assert conditions_of(refreshed)["Ready"] == ("False", "L1ExceedsNodeMemory")
    fresh = status_of(spec_of(), daemonset(2, 2), problems=None, now=T1)
    assert conditions_of(fresh)["ConfigValid"] == ("True", "Valid")


def test_terminating_and_unscheduled_pods_are_not_endpoints() -> None:
    terminating = pod("kv-old", "n1", True)
    terminating["metadata"]["deletionTimestamp"] = T0
    unscheduled = {"metadata": {"name": "kv-new"}, "spec": {}, "status": {}}
    assert endpoints([terminating, unscheduled, pod("kv-a", "n2", False, ip=None)], 6379) == [
        {"node": "n2", "pod": "kv-a", "ready": False}
    ]


def test_usage_of_no_answering_server() -> None:
    from strata_operator.resources.kvcachetier.usage import ServerUsage, summarize

    assert summarize([], instances=3) == {
        "scrapedInstances": 0,
        "unreachableInstances": 3,
        "lookups": 0,
        "misses": 0,
        "hitRatio": "0.000",
        "tiers": [],
    }
    two = [ServerUsage(hits={"l1": 3, "fs": 1}, misses=4, used={"l1": 10, "fs": 5}, capacity={"l1": 100})] * 2
    summary = summarize(two, instances=2)
    assert summary["hitRatio"] == "0.500"
    assert [(t["tier"], t["usedBytes"], t["hitRatio"]) for t in summary["tiers"]] == [
        ("l1", 20, "0.375"),
        ("fs", 10, "0.125"),
    ]


def _events_along(*steps: tuple[dict[str, Any] | None, str]) -> list[tuple[str, str, str]]:
    """The Events a sequence of (DaemonSet observed, time) would post, starting from an empty status."""
    status: dict[str, Any] = {}
    events = []
    for observed, now in steps:
        new = status_of(spec_of(l2={"fs": {"hostPath": {"path": "/mnt/kv"}}}), observed, previous=status, now=now)
        events += events_of(status, new)
        status = new
    return events


def at(seconds: int) -> str:
    return f"2026-12-01T10:{seconds // 60:02d}:{seconds % 60:02d}Z"


def test_a_healthy_creation_posts_no_warning() -> None:
    """Applied but not yet seen by the DaemonSet controller, then pods starting, then ready: the first two
    used to post Warning NoMatchingNodes and Warning NoReadyInstances on every creation."""
    events = _events_along(
        (None, at(0)),
        (daemonset(2, 0, settled=False), at(1)),
        (daemonset(2, 0), at(5)),
        (daemonset(2, 2), at(40)),
    )
    assert [e for e in events if e[0] == "Warning"] == []
    assert ("Normal", "InstancesServing", "2/2 nodes serve the KV tier") in events


def test_no_matching_nodes_is_a_warning_once_the_controller_has_looked() -> None:
    events = _events_along((daemonset(0, 0, settled=False), at(0)), (daemonset(0, 0), at(2)))
    assert [(t, r) for t, r, _ in events if t == "Warning"] == [("Warning", "NoMatchingNodes")]


def test_no_ready_server_after_the_grace_period_is_a_warning() -> None:
    events = _events_along(
        (daemonset(2, 0), at(0)),
        (daemonset(2, 0), at(STARTUP_GRACE_SECONDS - 1)),
        (daemonset(2, 0), at(STARTUP_GRACE_SECONDS + 1)),
    )
    warnings = [(t, r) for t, r, _ in events if t == "Warning"]
    assert warnings == [("Warning", "NoReadyInstances")]


def test_a_client_shm_smaller_than_vllms_cpu_tier_is_refused_by_name() -> None:
    facts = ClusterFacts(secrets={"kv-kv-token": None})
    small = spec_of(clientShmSize="2Gi", connector={"cpuBytes": "8Gi"}, auth={"disabled": True})
    (problem,) = validate(small, facts)
    assert problem.reason == "ShmTooSmall"
    assert "spec.clientShmSize (2Gi) is below spec.connector.cpuBytes (8Gi)" in problem.message
    assert validate(spec_of(clientShmSize="9Gi", connector={"cpuBytes": "8Gi"}, auth={"disabled": True}), facts) == []
    lmcache = spec_of(clientShmSize="2Gi", connector={"type": "lmcache", "cpuBytes": "8Gi"}, auth={"disabled": True})
    assert validate(lmcache, facts) == []


def socket_driver(pod_info: bool = True, modes: tuple[str, ...] = ("Ephemeral",)) -> dict[str, Any]:
    return {"metadata": {"name": "kv.strata.dev"}, "spec": {"podInfoOnMount": pod_info, "volumeLifecycleModes": modes}}


def test_a_node_socket_needs_its_csi_driver_installed_and_fit_for_inline_per_namespace_volumes() -> None:
    spec = spec_of(nodeSocket={"enabled": True})
    nodes = [node("gpu-1")]
    (missing,) = validate(spec, ClusterFacts(nodes=nodes, socket_driver_checked=True))
    assert missing.reason == "SocketDriverMissing" and "kvSocketDriver.enabled=true" in missing.message
    for unsuitable in (socket_driver(pod_info=False), socket_driver(modes=("Persistent",))):
        facts = ClusterFacts(nodes=nodes, socket_driver=unsuitable, socket_driver_checked=True)
        assert [p.reason for p in validate(spec, facts)] == ["SocketDriverUnsuitable"]
    assert validate(spec, ClusterFacts(nodes=nodes, socket_driver=socket_driver(), socket_driver_checked=True)) == []
    assert validate(spec_of(), ClusterFacts(nodes=nodes, socket_driver_checked=True)) == [], "socket off: no check"


@pytest.mark.parametrize(
    "desired",
    [2, 1],
    ids=["daemonset-counts-it", "daemonset-dropped-it"],  # 1: what the DaemonSet controller says once the node's
    # unreachable:NoSchedule taint takes it out of desiredNumberScheduled (seen on a frozen kind worker)
)
def test_a_server_down_with_its_node_names_the_node_and_why_in_a_warning(desired: int) -> None:
    why = "NodeStatusUnknown: Kubelet stopped posting node status. (since 2026-01-01T00:00:00Z)"
    spec = spec_of()
    pods = [pod("kv-a", "n1", True), pod("kv-b", "n2", False, "10.0.0.2")]
    before = status_of(spec, daemonset(2, 2), [pod("kv-a", "n1", True), pod("kv-b", "n2", True, "10.0.0.2")])
    observed = Observed(
        TIER, previous=before, now=T1, daemonset=daemonset(desired, 1), pods=pods, not_ready_nodes={"n2": why}
    )
    status = compute_status(spec, observed, Checked())
    check_status("KVCacheTier", status)
    conditions = {c["type"]: c for c in status["conditions"]}
    assert (conditions["AllInstancesReady"]["status"], conditions["AllInstancesReady"]["reason"]) == (
        "False",
        "NodeNotReady",
    )
    assert conditions["AllInstancesReady"]["message"].startswith(f"1/2 servers are ready; not Ready node(s): n2: {why}")
    assert conditions["Available"]["status"] == "True" and conditions["Reconciling"]["status"] == "True"
    assert [e.get("nodeNotReady") for e in status["endpoints"]] == [None, why]
    [event] = [e for e in events_of(before, status) if e[1] == "NodeNotReady"]
    assert event[0] == "Warning" and "n2: NodeStatusUnknown" in event[2]
    back = status_of(
        spec, daemonset(2, 2), [pod("kv-a", "n1", True), pod("kv-b", "n2", True, "10.0.0.2")], previous=status
    )
    assert ("Normal", "AllReady") in [e[:2] for e in events_of(status, back)]
    # A server still starting on a Ready node is progress, not a warning.
    starting = status_of(spec, daemonset(2, 1), [pod("kv-a", "n1", True), pod("kv-b", "n2", False)], previous=back)
    assert ("Normal", "InstancesNotReady") in [e[:2] for e in events_of(back, starting)]
