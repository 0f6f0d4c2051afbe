"""Status as a pure function of what was observed: conditions, phase, and the minimal patch to get there.

Phase and conditions follow what kstatus reads (`observedGeneration` plus a `Ready` condition), so
`kubectl wait --for=condition=Ready`, Flux and Argo CD know when a cache is usable.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata_loader.contract import FetchResult
from strata_units import format_bytes

from strata_operator.conditions import CONDITION_TYPES, DEGRADED, READY, RECONCILING, STALLED, set_condition
from strata_operator.resources.core import SPEC_INVALID, Problem

PHASE_PENDING, PHASE_PRELOADING, PHASE_READY, PHASE_DEGRADED, PHASE_FAILED = (
    "Pending",
    "Preloading",
    "Ready",
    "Degraded",
    "Failed",
)
PHASE_INSUFFICIENT_STORAGE = "InsufficientStorage"
"""A node's copy that does not fit its NodeCachePolicy's budget even after eviction (the loader's reason too)."""
PHASE_EVICTED = "Evicted"
"""A node's copy another cache's Job evicted to make room; not counted among the nodes that should have one."""
PHASE_NODE_NOT_READY = "NodeNotReady"
"""A node that stopped being Ready (its kubelet stopped posting status): its state as it was is kept aside
(`node_loss`) and comes back when the node does; not counted among the nodes a copy can be used on meanwhile."""
JOB_MISSING, JOB_RUNNING, JOB_SUCCEEDED, JOB_FAILED = "Missing", "Running", "Succeeded", "Failed"
JOB_PHASES = (JOB_RUNNING, JOB_SUCCEEDED, JOB_FAILED)


class SpecError(ValueError):
    """A spec the API server accepted but the builders cannot turn into children: names the field to change."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"spec.{field}: {message}")
        self.field = field

    def problem(self) -> Problem:
        return Problem(SPEC_INVALID, f"{self}; fix the spec, the operator retries when it changes")


@dataclass
class Outcome:
    """What one reconcile concluded, before it is rendered into conditions."""

    phase: str
    ready: tuple[bool, str, str]
    reconciling: tuple[bool, str, str]
    degraded: tuple[bool, str, str] = (False, "AsExpected", "")
    fields: dict[str, Any] = field(default_factory=dict)


def job_phase(job: Mapping[str, Any] | None) -> str:
    """Missing, Running (also pending), Succeeded or Failed, from the Job's terminal conditions."""
    if job is None:
        return JOB_MISSING
    for condition in job.get("status", {}).get("conditions") or []:
        if condition.get("status") != "True":
            continue
        if condition.get("type") in ("Complete", "SuccessCriteriaMet"):
            return JOB_SUCCEEDED
        if condition.get("type") in ("Failed", "FailureTarget"):
            return JOB_FAILED
    return JOB_RUNNING


def job_failure_message(job: Mapping[str, Any]) -> str:
    for condition in job.get("status", {}).get("conditions") or []:
        if condition.get("type") in ("Failed", "FailureTarget") and condition.get("status") == "True":
            return f"{condition.get('reason', 'Failed')}: {condition.get('message', '')}".strip(": ")
    return "the Job failed"


def termination_message(pods: Sequence[Mapping[str, Any]], container: str, *, succeeded: bool) -> str | None:
    """The message of the newest pod that ended the way the Job did (Succeeded or Failed)."""
    wanted = "Succeeded" if succeeded else "Failed"
    ended = [p for p in pods if p.get("status", {}).get("phase") == wanted]
    ended.sort(key=lambda p: p.get("metadata", {}).get("creationTimestamp") or "")
    for pod in reversed(ended):
        for status in pod.get("status", {}).get("containerStatuses") or []:
            terminated = (status.get("state") or {}).get("terminated") or {}
            if status.get("name") == container and terminated.get("message"):
                return str(terminated["message"])
    return None


PULL_FAILURES = ("ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull")
"""Waiting reasons the kubelet gives a container whose image (or image volume) it cannot pull."""


def pull_failure(pods: Sequence[Mapping[str, Any]]) -> str | None:
    """`<reason>: <the runtime's message>` of the newest pod the kubelet cannot pull for, or None."""
    ordered = sorted(pods, key=lambda p: p.get("metadata", {}).get("creationTimestamp") or "", reverse=True)
    for pod in ordered:
        for status in pod.get("status", {}).get("containerStatuses") or []:
            waiting = (status.get("state") or {}).get("waiting") or {}
            if waiting.get("reason") in PULL_FAILURES:
                return f"{waiting['reason']}: {waiting.get('message') or 'no message'}"
    return None


def verify_result(result: FetchResult, source: str, revision: str | None) -> str | None:
    """Why a result cannot be trusted, or None: it must have succeeded, for our source, with files in it."""
    if not result.succeeded:
        return result.error or "the preloader reported a failure without an error message"
    if result.source and result.source != source:
        return f"the preloader copied {result.source!r}, not {source!r}"
    if (
        revision
        and result.revision
        and result.revision != revision
        and not _resolved(source, revision, result.revision)
    ):
        return f"the preloader copied revision {result.revision!r}, not {revision!r}"
    if result.files <= 0:
        return f"the preloader copied no files from {source}: check source.uri and source.include"
    return None


_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def _resolved(source: str, revision: str, copied: str) -> bool:
    """An hf:// branch or tag comes back as the commit it named (what status.resolvedRevision records); a
    revision that is already a commit must come back as itself."""
    return source.startswith("hf://") and not _COMMIT.match(revision) and bool(_COMMIT.match(copied))


def pinned_revision(source: str, asked: str | None, previous: Mapping[str, Any]) -> str | None:
    """NodeLocal from an hf:// branch or tag: the commit the first copies resolved it to, which every node that
    starts later copies too, so a branch that moves meanwhile cannot give nodes different models. Only while
    the spec still asks for the revision that commit was resolved from (`resolvedFrom`); None otherwise."""
    resolved = previous.get("resolvedRevision")
    if not source.startswith("hf://") or not isinstance(resolved, str) or not _COMMIT.match(resolved):
        return None
    if asked == resolved or previous.get("resolvedFrom") != (asked or ""):
        return None
    return resolved


def result_fields(result: FetchResult) -> dict[str, Any]:
    return {
        "totalBytes": result.bytes,
        "totalFiles": result.files,
        "size": format_bytes(result.bytes, approximate=True),
        "seconds": round(result.seconds, 3),
        "resolvedRevision": result.revision,
        "manifestSha256": result.manifest_sha256,
    }


def render_status(
    previous: Mapping[str, Any], outcome: Outcome, generation: int | None, now: str | None = None
) -> dict[str, Any]:
    """The whole desired status; lastTransitionTime only moves when a condition's status flips."""
    # Only the current vocabulary: a condition type an older operator wrote (Progressing) is dropped.
    conditions = [dict(c) for c in previous.get("conditions") or [] if c.get("type") in CONDITION_TYPES["ModelCache"]]
    for type_, (flag, reason, message) in (
        (READY, outcome.ready),
        (RECONCILING, outcome.reconciling),
        (STALLED, stalled(outcome)),
        (DEGRADED, outcome.degraded),
    ):
        conditions = set_condition(conditions, type_, flag, reason, message, generation=generation, now=now)
    status: dict[str, Any] = {k: v for k, v in outcome.fields.items() if v is not None}
    status.update(phase=outcome.phase, observedGeneration=generation, conditions=conditions)
    return status


def stalled(outcome: Outcome) -> tuple[bool, str, str]:
    """kstatus' Stalled: something failed and nothing is in progress that would mend it, usable or not: it waits
    for a person, so Flux says Failed (and Argo CD Degraded) whenever Degraded is True and Reconciling is not
    (`conditions.py`, GitOps verdicts)."""
    flag, reason, message = outcome.degraded
    if flag and not outcome.reconciling[0]:
        return True, reason, message
    return False, outcome.reconciling[1] if outcome.reconciling[0] else outcome.ready[1], ""


NODE_EVENTS = {
    PHASE_READY: "NodeReady",
    PHASE_FAILED: "NodePreloadFailed",
    PHASE_INSUFFICIENT_STORAGE: "NodeInsufficientStorage",
    PHASE_EVICTED: "NodeCopyEvicted",
    PHASE_NODE_NOT_READY: "NodeNotReady",
}
"""The Event reason of each node phase worth one (Ready is Normal, the others Warnings)."""


def node_events(previous: Mapping[str, Any], desired: Mapping[str, Any]) -> list[tuple[str, str, str]]:
    """(type, reason, message) for each node whose copy changed to a phase worth an Event (`NODE_EVENTS`), and
    a Normal `NodeReturned` for each node Ready again after NodeNotReady; the conditions' Events are
    `conditions.transition_events`."""
    events: list[tuple[str, str, str]] = []
    old_nodes = {n["name"]: n.get("phase") for n in previous.get("nodes") or []}
    for node in desired.get("nodes") or []:
        if old_nodes.get(node["name"]) == PHASE_NODE_NOT_READY and node["phase"] != PHASE_NODE_NOT_READY:
            now = f"{node['phase']}: {node['message']}" if node.get("message") else node["phase"]
            events.append(("Normal", "NodeReturned", f"node {node['name']} is Ready again; its copy: {now}"))
            continue
        if old_nodes.get(node["name"]) != node["phase"] and node["phase"] in NODE_EVENTS:
            kind = "Normal" if node["phase"] == PHASE_READY else "Warning"
            reason = NODE_EVENTS[node["phase"]]
            events.append((kind, reason, f"node {node['name']}: {node.get('message') or node['phase']}"))
    return events


def blocked_outcome(problem: Problem, fields: dict[str, Any]) -> Outcome:
    """Bad input: say what is wrong and wait for a person (the next spec change or resync retries)."""
    return Outcome(
        phase=PHASE_FAILED,
        ready=(False, problem.reason, problem.message),
        reconciling=(False, problem.reason, "waiting for the problem to be fixed"),
        degraded=(True, problem.reason, problem.message),
        fields=fields,
    )


def ready_outcome(fields: dict[str, Any], message: str) -> Outcome:
    return Outcome(
        phase=PHASE_READY,
        ready=(True, "Preloaded", message),
        reconciling=(False, "Preloaded", "nothing left to do"),
        fields=fields,
    )


def preloading_outcome(fields: dict[str, Any], message: str) -> Outcome:
    return Outcome(
        phase=PHASE_PRELOADING,
        ready=(False, "Preloading", message),
        reconciling=(True, "Preloading", message),
        fields=fields,
    )


def failed_outcome(fields: dict[str, Any], reason: str, message: str) -> Outcome:
    return Outcome(
        phase=PHASE_FAILED,
        ready=(False, reason, message),
        reconciling=(False, reason, "stopped: see the Degraded condition"),
        degraded=(True, reason, message),
        fields=fields,
    )


def nodes_outcome(
    states: list[dict[str, Any]], *, ready_reason: str, ready_message: str, fields: dict[str, Any]
) -> Outcome:
    """Per-node states rolled up: Ready when every node is, Degraded or Failed when some or all failed.

    Nodes that are not Ready (NodeNotReady) are left out of "every node": a copy Ready on all the others is usable
    (pods land only on Ready nodes), but the cache is Degraded and Reconciling, naming them, until they return or
    their Node objects are deleted."""
    evicted = sum(1 for s in states if s["phase"] == PHASE_EVICTED)
    lost = [s for s in states if s["phase"] == PHASE_NODE_NOT_READY]
    states = [s for s in states if s["phase"] not in (PHASE_EVICTED, PHASE_NODE_NOT_READY)]
    if evicted and not states and not lost:
        message = f"the copy was evicted from all {evicted} node(s) to make room for other caches"
        return Outcome(
            PHASE_DEGRADED,
            (False, "Evicted", message),
            (False, "Evicted", "remove the Evicted node labels to fetch again"),
            (True, "Evicted", message),
            fields,
        )
    total = len(states) + len(lost)
    ready = sum(1 for s in states if s["phase"] == PHASE_READY)
    failed = [s for s in states if s["phase"] in (PHASE_FAILED, PHASE_INSUFFICIENT_STORAGE)]
    blocked = [s for s in states if s["phase"] == PHASE_PENDING]
    in_flight = len(states) - ready - len(failed) - len(blocked)
    count = f"{ready}/{total} nodes ready" + (f" ({evicted} evicted)" if evicted else "")
    if lost:
        count += f", not Ready: {', '.join(s['name'] for s in lost)}"
    if in_flight:
        reconciling = (True, "Preloading", f"{count}, {in_flight} in progress")
    elif lost:
        reconciling = (True, PHASE_NODE_NOT_READY, f"{count}: waiting for them to return or their Nodes to be deleted")
    else:
        reconciling = (False, "Settled", count)
    degraded = (False, "AsExpected", "")
    if failed or blocked:
        worst = failed[0] if failed else blocked[0]
        reason = "NodePreloadFailed" if failed else "NodePreloadBlocked"
        if worst["phase"] == PHASE_INSUFFICIENT_STORAGE:
            reason = PHASE_INSUFFICIENT_STORAGE
        degraded = (
            True,
            reason,
            f"{len(failed) + len(blocked)} of {total} nodes: {worst['name']}: {worst.get('message')}",
        )
    elif lost:
        first = lost[0]
        degraded = (
            True,
            PHASE_NODE_NOT_READY,
            f"{len(lost)} of {total} nodes: {first['name']}: {first.get('message')}",
        )
    if ready == len(states) and (ready or not lost):  # every node that is Ready has its copy
        phase = PHASE_DEGRADED if lost else PHASE_READY
        return Outcome(phase, (True, ready_reason, f"{count}; {ready_message}"), reconciling, degraded, fields)
    phase = PHASE_PRELOADING if in_flight else (PHASE_DEGRADED if ready or lost else PHASE_FAILED)
    return Outcome(
        phase,
        (False, degraded[1] if degraded[0] and not in_flight else "Preloading", count),
        reconciling,
        degraded,
        fields,
    )
