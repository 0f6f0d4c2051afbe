"""Per node (NodeLocal copies and ImageVolume pre-pulls): one Job per wanted node, its state from the Job and its
result, re-creation with back-off, evictions and node budgets, and the node labels that say where a copy is Ready.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strata_loader.contract import FetchResult

from strata_operator.resources.core import Event
from strata_operator.resources.modelcache import capacity, demand, names, node_loss, storage
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache.draft import (
    INSUFFICIENT_RETRY_SECONDS,
    RECREATE_BASE_SECONDS,
    RECREATE_MAX_SECONDS,
    TIME_FORMAT,
    JobBuilder,
    LabelChange,
    Planner,
    job_result,
    parse_time,
)
from strata_operator.resources.modelcache.nodes import NodeInfo


def selected_nodes(nodes: Mapping[str, NodeInfo], selector: Mapping[str, str]) -> dict[str, NodeInfo]:
    """The Ready nodes the selector picks."""
    return {n: i for n, i in nodes.items() if i.ready and i.matches(selector)}


@dataclass
class NodeStates:
    states: list[dict[str, Any]]
    revisions: dict[str, str | None]
    """Per node with a result read now: the revision the preloader resolved (not part of the node's status)."""


def node_states(
    planner: Planner,
    role: str,
    wanted: Mapping[str, NodeInfo],
    build: JobBuilder,
    lost: Mapping[str, NodeInfo] | None = None,
) -> NodeStates:
    """One state per wanted node: the Job its request names is created where missing, ours not wanted go; and
    one per `lost` node (selected, not Ready, `node_loss`), whose Job is kept as it is.

    Level-based: the wanted set is "selected Ready nodes now"; each gets exactly the Job its current request
    hash names, and anything else of ours is deleted.
    """
    observed = planner.observed
    before = {n["name"]: n for n in observed.previous.get("nodes") or []}
    result = NodeStates([], {})
    keep: set[str] = set()
    for name, info in sorted((lost or {}).items()):
        state = node_loss.lost_state(before[name], info)
        if state.get("job"):
            keep.add(str(state["job"]))
        result.states.append(state)
    for name in sorted(wanted):
        _, job = build(name, wanted[name].uid)
        job_name = job["metadata"]["name"]
        keep.add(job_name)
        prev, live = before.get(name) or {}, observed.jobs.get(job_name)
        if evicted := _evicted(planner, name, job_name, prev, live):
            result.states.append(evicted)
            continue
        if prev.get("job") == job_name and prev.get("phase") == st.PHASE_READY:
            result.states.append(_settled(planner, name, prev))  # the Job may be gone (TTL); the result is recorded
            continue
        if live is None:
            result.states.append(_missing_job(planner, name, job, role, prev))
            continue
        if prev.get("job") != job_name:  # created just before a crash: its start was never reported
            planner.events.append(_start_event(role, job_name, name))
        state, fetched = _state_from_job(planner, name, live, read_result=role == storage.ROLE_PRELOAD)
        state = _capacity_outcome(planner, name, prev, state)
        if fetched is not None:
            result.revisions[name] = fetched.revision
        if prev.get("job") == job_name and prev.get("recreations") and state["phase"] != st.PHASE_READY:
            state["recreations"] = prev["recreations"]  # so the next vanishing waits longer
        result.states.append(state)
    for job_name in sorted(observed.jobs.keys() - keep):
        planner.delete_job(job_name)
    return result


def _evicted(
    planner: Planner, node: str, job_name: str, prev: Mapping[str, Any], live: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """An evicted copy's state: Evicted while the node label says so (another cache's Job removed the copy) and
    no waiting pod needs it; once one does (`demand`), or the label is removed, the old Job goes so the copy is
    fetched again (within the node's budget, like any new copy). None when not evicted."""
    key = planner.node_label
    if key is None or prev.get("job") != job_name:
        return None
    label = planner.observed.nodes[node].labels.get(key)
    if prev.get("phase") == st.PHASE_READY and label == capacity.NODE_LABEL_EVICTED:
        return capacity.evicted_state(prev)
    if prev.get("phase") != st.PHASE_EVICTED:
        return None
    if label == capacity.NODE_LABEL_EVICTED:
        pod = planner.needed_again.get(node)
        if pod is None:
            return dict(prev)
        why = f"pod {pod} is waiting and could run on {node}"
        planner.events.append(("Normal", "CopyNeededAgain", f"fetching the evicted copy on {node} again: {why}"))
    else:
        why = "its node label was removed"
    if live is not None:  # its result describes a copy that is gone: a new Job fetches again
        planner.delete_job(job_name, ("Normal", "PreloadAgain", f"Job {job_name}: fetching the evicted copy again"))
        return {"name": node, "job": job_name, "phase": st.PHASE_PENDING, "message": f"fetching again: {why}"}
    return _start_node_job(planner, node, planner.build(node), storage.ROLE_PRELOAD)


def needed_again(planner: Planner, wanted: Mapping[str, NodeInfo]) -> dict[str, str]:
    """The evicted copies waiting pods need back (`demand`), from the node states this plan starts with."""
    before = {str(n.get("name")): n for n in planner.observed.previous.get("nodes") or []}
    gone = (st.PHASE_EVICTED, st.PHASE_FAILED, st.PHASE_INSUFFICIENT_STORAGE)
    evicted = {n: str(s.get("lastUsed") or "") for n, s in before.items() if s.get("phase") == st.PHASE_EVICTED}
    having = {n for n in wanted if (before.get(n) or {}).get("phase") not in gone}
    return demand.needed_again(planner.observed.waiting, wanted, evicted, having)


def _capacity_outcome(planner: Planner, node: str, prev: Mapping[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """What a node Job's capacity report means beyond its own copy.

    The copies it evicted get their node label set to Evicted (once per result: a label someone removes to
    fetch a copy again is not set back). A copy that did not fit is tried again, with a fresh budget, once
    `INSUFFICIENT_RETRY_SECONDS` passed: the Job is deleted and the usual re-creation creates it anew."""
    same = prev.get("job") == state["job"]
    if state.get("evicted") and not (same and prev.get("evicted") == state["evicted"]):
        for name in state["evicted"]:
            namespace, _, cache = name.partition("/")
            key = names.node_label_key(namespace, cache)
            planner.labels.append(LabelChange(node, key, capacity.NODE_LABEL_EVICTED, foreign=True))
            planner.events.append(("Normal", "CopyEvicted", f"evicted {name} on {node} to make room"))
    if state["phase"] != st.PHASE_INSUFFICIENT_STORAGE:
        return state
    now = planner.observed.now
    if same and prev.get("phase") == st.PHASE_INSUFFICIENT_STORAGE and prev.get("retryAfter"):
        state["retryAfter"] = prev["retryAfter"]
    else:
        when = now + datetime.timedelta(seconds=INSUFFICIENT_RETRY_SECONDS)
        state["retryAfter"] = when.strftime(TIME_FORMAT)
    if now >= parse_time(state["retryAfter"]):
        planner.delete_job(state["job"])
    return state


def _settled(planner: Planner, node: str, prev: Mapping[str, Any]) -> dict[str, Any]:
    """A Ready copy as recorded; NodeLocal copies keep their lastUsed current while pods use them."""
    state = dict(prev)
    if planner.node_label is not None:
        consumers = planner.observed.consumers_on.get(node, 0)
        state["lastUsed"] = capacity.last_used(prev, state, consumers, planner.observed.now)
    return state


def _start_event(role: str, job_name: str, node: str) -> Event:
    if role == storage.ROLE_PRELOAD:
        return "Normal", "PreloadStarted", f"Job {job_name} copies the model on {node}"
    return "Normal", "PrePullStarted", f"Job {job_name} pulls the image on {node}"


def _missing_job(
    planner: Planner, node: str, job: Mapping[str, Any], role: str, prev: Mapping[str, Any]
) -> dict[str, Any]:
    """Create the node's Job, unless it is one we created that vanished before its result was recorded (a TTL
    shorter than our reading, someone deleting it): then back off exponentially, counting in status, instead of
    creating it again at once in a loop."""
    job_name = job["metadata"]["name"]
    ours = prev.get("job") == job_name and prev.get("phase") in (
        st.PHASE_PRELOADING,
        st.PHASE_FAILED,
        st.PHASE_INSUFFICIENT_STORAGE,
    )
    if not ours:
        return _start_node_job(planner, node, job, role)
    now = planner.observed.now
    recreations = int(prev.get("recreations") or 0)
    if retry_after := prev.get("retryAfter"):
        if now < parse_time(retry_after):
            return dict(prev)
        state = _start_node_job(planner, node, job, role)
        return {**state, "recreations": recreations} if state["phase"] == st.PHASE_PRELOADING else state
    recreations += 1
    delay = min(RECREATE_MAX_SECONDS, RECREATE_BASE_SECONDS * 2 ** (recreations - 1))
    when = now + datetime.timedelta(seconds=delay)
    return {
        "name": node,
        "job": job_name,
        "phase": st.PHASE_PRELOADING,
        "recreations": recreations,
        "retryAfter": when.strftime(TIME_FORMAT),
        "message": f"Job {job_name} vanished before its result was read ({recreations} time(s)); "
        f"creating it again after {delay}s",
    }


def _start_node_job(planner: Planner, node: str, job: Mapping[str, Any], role: str) -> dict[str, Any]:
    job_name = job["metadata"]["name"]
    state: dict[str, Any] = {"name": node, "job": job_name}
    if problem := planner.input_problem():
        return {**state, "phase": st.PHASE_PENDING, "message": problem.message}
    job, given = _with_budget(planner, node, job)
    if given is not None:
        state["policy"] = given.policy
    if refusal := planner.create(job, _start_event(role, job_name, node)):
        return {**state, "phase": st.PHASE_FAILED, "message": f"Job rejected: {refusal}"}
    return {**state, "phase": st.PHASE_PRELOADING}


def _with_budget(
    planner: Planner, node: str, job: Mapping[str, Any]
) -> tuple[Mapping[str, Any], capacity.CapacityRequest | None]:
    """NodeLocal: the Job with its node's budget, when a NodeCachePolicy covers the node and path."""
    observed = planner.observed
    view, spec = observed.capacity, observed.spec
    if planner.node_label is None or view is None or spec is None or node not in observed.nodes:
        return job, None
    given = capacity.budget(view, observed.owner, spec, observed.nodes[node])
    return (job, None) if given is None else (capacity.with_budget(job, given), given)


def _state_from_job(
    planner: Planner, node: str, job: Mapping[str, Any], *, read_result: bool
) -> tuple[dict[str, Any], FetchResult | None]:
    state: dict[str, Any] = {"name": node, "job": job["metadata"]["name"]}
    phase = st.job_phase(job)
    if not read_result:  # a pre-pull: the kubelet's pull error is in its pod's status while the Job runs
        pulling = st.pull_failure(planner.observed.pods.get(state["job"]) or [])
        if phase == st.JOB_SUCCEEDED:
            return {**state, "phase": st.PHASE_READY, "message": "image pulled"}, None
        if pulling is not None:
            return {**state, "phase": st.PHASE_FAILED, "message": pulling}, None
        if phase == st.JOB_RUNNING:
            return {**state, "phase": st.PHASE_PRELOADING}, None
        return {**state, "phase": st.PHASE_FAILED, "message": st.job_failure_message(job)}, None
    if phase == st.JOB_RUNNING:
        return {**state, "phase": st.PHASE_PRELOADING}, None
    spec = planner.observed.spec
    assert spec is not None  # only planned with a usable spec
    result, error = job_result(planner.observed, spec, job, succeeded=phase == st.JOB_SUCCEEDED)
    if result is not None:
        state.update(capacity.result_fields(result))
    if error is not None or result is None:
        failed = st.PHASE_INSUFFICIENT_STORAGE if capacity.insufficient(result) else st.PHASE_FAILED
        return {**state, "phase": failed, "message": error or "no result"}, None
    ready = {
        **state,
        "phase": st.PHASE_READY,
        "lastUsed": planner.observed.now.strftime(TIME_FORMAT),
        "bytes": result.bytes,
        "files": result.files,
        "seconds": round(result.seconds, 3),
        "manifestSha256": result.manifest_sha256,  # fan-out: what peers must prove they hold
        "message": f"verified copy: {result.files} files",
    }
    return ready, result


def label_changes(nodes: Mapping[str, NodeInfo], key: str, ready: set[str]) -> list[LabelChange]:
    """`<key>=Ready` exactly on nodes with a verified copy; a change only where that is not so yet."""
    changes = []
    for name, info in sorted(nodes.items()):
        want = name in ready
        if want != (info.labels.get(key) == names.NODE_LABEL_READY):
            changes.append(LabelChange(name, key, names.NODE_LABEL_READY if want else None))
    return changes
