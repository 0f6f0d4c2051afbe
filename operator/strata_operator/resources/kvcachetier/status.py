"""Status from what was observed (DaemonSet counters, pods per node, the claim) and what the plan concluded
about the configuration (`Checked`).

Pure and cheap on purpose: with hundreds of GPU nodes it runs on every DaemonSet status change.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.conditions import (
    ALL_INSTANCES_READY,
    AVAILABLE,
    CONFIG_VALID,
    L2_REACHABLE,
    OFFLOAD_EFFECTIVE,
    READY,
    RECONCILING,
    STALLED,
    get_condition,
    now_rfc3339,
    set_condition,
)
from strata_operator.resources.core import Problem
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.observed import Observed
from strata_operator.resources.kvcachetier.offload import CONDITION_STATUS, offload_status, sample
from strata_operator.resources.kvcachetier.storage import l2_claim_name, l2_kinds

NODE_NOT_READY = "NodeNotReady"
"""AllInstancesReady's reason while servers are down because their nodes are (a Warning Event names them)."""

STARTUP_GRACE_SECONDS = 300
"""How long a tier may have no ready server before that is a Warning: pulling the image and starting take time."""


@dataclass(frozen=True)
class Checked:
    """What the plan concluded about the configuration (a verdict, not an observation)."""

    problems: Sequence[Problem] | None = ()
    """None: not checked this time (a status-only refresh); ConfigValid keeps its previous value."""
    warnings: Sequence[str] = ()
    config_hash: str | None = None
    """The applied configuration's digest; None when nothing was applied this time."""


@dataclass(frozen=True)
class Counts:
    desired: int
    ready: int
    updated: int
    settled: bool
    """The DaemonSet controller has seen the latest template (its counters are about it)."""

    @classmethod
    def of(cls, daemonset: Mapping[str, Any] | None) -> Counts:
        if daemonset is None:
            return cls(0, 0, 0, False)
        status = daemonset.get("status") or {}
        generation = daemonset.get("metadata", {}).get("generation", 0)
        return cls(
            desired=int(status.get("desiredNumberScheduled") or 0),
            ready=int(status.get("numberReady") or 0),
            updated=int(status.get("updatedNumberScheduled") or 0),
            settled=int(status.get("observedGeneration") or 0) >= generation,
        )


def pod_ready(pod: Mapping[str, Any]) -> bool:
    conditions = pod.get("status", {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def endpoints(
    pods: Sequence[Mapping[str, Any]],
    port: int,
    events_port: int | None = None,
    not_ready_nodes: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """One entry per node that runs a (non-terminating) server, sorted by node name; with KV events on, each
    server's publisher too (a router subscribes to every node's, not to the node-local Service); a server whose
    node is not Ready says why (`not_ready_nodes`)."""
    result = []
    for pod in pods:
        node = pod.get("spec", {}).get("nodeName")
        if not node or pod.get("metadata", {}).get("deletionTimestamp"):
            continue
        entry: dict[str, Any] = {"node": node, "pod": pod["metadata"]["name"], "ready": pod_ready(pod)}
        if not entry["ready"] and node in (not_ready_nodes or {}):
            entry["nodeNotReady"] = (not_ready_nodes or {})[node]
        ip = pod.get("status", {}).get("podIP")
        if ip:
            entry["address"] = f"{ip}:{port}"
            if events_port is not None:
                entry["events"] = f"tcp://{ip}:{events_port}"
        result.append(entry)
    return sorted(result, key=lambda e: (e["node"], e["pod"]))


def _instances(
    counts: Counts, config_valid: bool, not_ready_nodes: Mapping[str, str], servers: Sequence[Mapping[str, Any]]
) -> tuple[bool, str, str]:
    """AllInstancesReady from the DaemonSet's counters, except while a server's node is not Ready: then from the
    servers themselves (`servers`: the endpoints). The DaemonSet controller stops counting a server whose node is
    unreachable (the node's `unreachable:NoSchedule` taint takes the node out of desiredNumberScheduled while the
    pod stays, tolerating the NoExecute one), so its counters read "all 1 servers are ready" with one of two down.
    """
    if counts.desired == 0 and not config_valid:
        return False, "ConfigInvalid", "no servers run: the configuration is not valid"
    if not counts.settled:
        # Until the DaemonSet controller has seen this template its counters (0 desired) say nothing.
        return False, "RollingOut", "waiting for the DaemonSet controller to place servers"
    if counts.desired == 0:
        return False, "NoMatchingNodes", "no node matches nodeSelector/tolerations"
    if counts.updated < counts.desired:
        return False, "RollingOut", f"{counts.updated}/{counts.desired} servers run the current configuration"
    if not_ready_nodes:
        lost = "; ".join(f"{node}: {why}" for node, why in sorted(not_ready_nodes.items()))
        ready = sum(1 for server in servers if server["ready"])
        message = f"{ready}/{len(servers)} servers are ready; not Ready node(s): {lost}"
        return False, NODE_NOT_READY, f"{message} (their node-local clients reach no server until they return)"
    if counts.ready < counts.desired:
        return False, "InstancesNotReady", f"{counts.ready}/{counts.desired} servers are ready"
    return True, "AllReady", f"all {counts.desired} servers are ready"


def _seconds_unavailable(previous: Mapping[str, Any], now: str | None) -> float:
    """How long Available has been False, from its lastTransitionTime (0 when it was not False before)."""
    kept = get_condition(previous.get("conditions") or [], AVAILABLE)
    if kept is None or kept.get("status") != "False" or not kept.get("lastTransitionTime"):
        return 0.0
    since = datetime.datetime.fromisoformat(str(kept["lastTransitionTime"]).replace("Z", "+00:00"))
    at = datetime.datetime.fromisoformat((now or now_rfc3339()).replace("Z", "+00:00"))
    return (at - since).total_seconds()


def _available(
    counts: Counts, instances_reason: str, previous: Mapping[str, Any], now: str | None
) -> tuple[bool, str, str]:
    if counts.ready > 0:
        return True, "InstancesServing", f"{counts.ready}/{counts.desired} nodes serve the KV tier"
    if instances_reason in ("NoMatchingNodes", "ConfigInvalid"):
        return False, instances_reason, "no server is running"
    waited = _seconds_unavailable(previous, now)
    if waited < STARTUP_GRACE_SECONDS:
        return False, "InstancesStarting", "no server is ready yet: the servers are starting"
    return (
        False,
        "NoReadyInstances",
        f"no server has become ready in {int(waited)} s: see the events of the tier's pods (image pull, scheduling)",
    )


def _l2(spec: KVCacheTierSpec, tier: TierRef, claim: Mapping[str, Any] | None, counts: Counts) -> tuple[str, str, str]:
    if spec.l2 is None:
        return "True", "NotConfigured", "L1 only: no L2 tier configured"
    claim_name = l2_claim_name(spec, tier)
    if claim_name is not None:
        phase = (claim or {}).get("status", {}).get("phase")
        if claim is None:
            return "False", "PVCNotFound", f"PersistentVolumeClaim {claim_name!r} does not exist"
        if phase != "Bound":
            return "False", "PVCNotBound", f"PersistentVolumeClaim {claim_name!r} is {phase or 'Pending'}"
    if counts.ready > 0:
        return "True", "ServersReady", f"{l2_kinds(spec)} L2 in use by {counts.ready} ready servers"
    return "Unknown", "NoReadyServer", "no server is ready to reach the L2 tier yet"


def _config_valid(checked: Checked, previous: Mapping[str, Any]) -> tuple[bool, str, str]:
    if checked.problems is None:
        kept = get_condition(previous.get("conditions") or [], CONFIG_VALID)
        if kept is not None:
            return kept.get("status") == "True", str(kept.get("reason")), str(kept.get("message", ""))
    if checked.problems:
        return False, checked.problems[0].reason, "; ".join(p.message for p in checked.problems)
    return True, "Valid", "; ".join(checked.warnings) or "configuration accepted"


def compute_status(spec: KVCacheTierSpec, observed: Observed, checked: Checked) -> dict[str, Any]:
    """The whole status object; conditions keep their lastTransitionTime unless their status flips. What this
    reconcile did not look at again (the applied configuration's digest, the servers' usage) stays as stored."""
    tier, previous, now = observed.tier, observed.previous, observed.now
    counts = Counts.of(observed.daemonset)
    valid = _config_valid(checked, previous)
    servers = endpoints(
        observed.pods, spec.port, spec.events.port if spec.events.enabled else None, observed.not_ready_nodes
    )
    all_ready = _instances(counts, valid[0], observed.not_ready_nodes, servers)
    available = _available(counts, all_ready[1], previous, now)
    l2 = _l2(spec, tier, observed.claim, counts)
    ready = (True, all_ready[1], all_ready[2]) if valid[0] and all_ready[0] else (False, *_not_ready(valid, all_ready))
    conditions: list[dict[str, Any]] = list(previous.get("conditions") or [])
    for type_, (status, reason, message) in (
        (CONFIG_VALID, valid),
        (AVAILABLE, available),
        (ALL_INSTANCES_READY, all_ready),
        (L2_REACHABLE, l2),
        (READY, ready),
        (RECONCILING, _reconciling(valid, all_ready)),
        (STALLED, _stalled(valid)),
    ):
        conditions = set_condition(conditions, type_, status, reason, message, generation=tier.generation, now=now)
    status_obj: dict[str, Any] = {
        "observedGeneration": tier.generation,
        "desiredInstances": counts.desired,
        "readyInstances": counts.ready,
        "updatedInstances": counts.updated,
        "l2": l2_kinds(spec),
        "connectionConfigMap": tier.connection_config_map,
        "service": tier.service,
        "endpoints": servers,
        "conditions": conditions,
    }
    config_hash = checked.config_hash or previous.get("configHash")
    if config_hash:
        status_obj["configHash"] = config_hash
    usage = previous.get("usage") if observed.usage is None else observed.usage
    if usage is not None:
        status_obj["usage"] = usage
    offload = previous.get("offload")
    if observed.servers is not None:  # a scrape: the window moves and the verdict is judged again
        latest = sample(observed.servers, now or now_rfc3339(), observed.engines)
        offload, message = offload_status(spec, offload, latest)
        verdict = offload["verdict"]
        status_obj["conditions"] = set_condition(
            conditions,
            OFFLOAD_EFFECTIVE,
            CONDITION_STATUS.get(verdict, "Unknown"),
            verdict,
            message,
            generation=tier.generation,
            now=now,
        )
    if offload is not None:
        status_obj["offload"] = offload
    return status_obj


def _reconciling(valid: tuple[bool, str, str], all_ready: tuple[bool, str, str]) -> tuple[bool, str, str]:
    if valid[0] and not all_ready[0] and all_ready[1] != "NoMatchingNodes":
        return True, all_ready[1], all_ready[2]
    return False, "Settled", "nothing in progress"


def _stalled(valid: tuple[bool, str, str]) -> tuple[bool, str, str]:
    return (False, "Valid", "configuration accepted") if valid[0] else (True, valid[1], valid[2])


def _not_ready(valid: tuple[bool, str, str], all_ready: tuple[bool, str, str]) -> tuple[str, str]:
    return (valid[1], valid[2]) if not valid[0] else (all_ready[1], all_ready[2])
