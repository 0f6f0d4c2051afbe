"""Per-node work: NodeLocal copies (a Job per selected Ready node, then a node label) and image pre-pulls.
(Removing the copies when a cache is deleted is `modelcache_cleanup`.)

Level-based: the wanted set is "selected Ready nodes now"; each gets exactly the Job its current request hash
names, anything else of ours is deleted, and a node is labelled exactly when its copy is verified.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from typing import Any

from kubernetes.dynamic.exceptions import ApiException, NotFoundError

from strata_operator import kube
from strata_operator.handlers.modelcache_io import (
    Context,
    api_error_message,
    delete_job,
    job_result,
    list_children,
)
from strata_operator.handlers.modelcache_nodes import NODES, NodeInfo, patch_node_label
from strata_operator.resources.modelcache import names, storage
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache.jobs import MODEL_MOUNT, fetch_request, request_hash
from strata_operator.resources.modelcache.status import Outcome
from strata_operator.resources.modelcache.volume import build_volume_snippet

RECREATE_BASE_SECONDS = 30
RECREATE_MAX_SECONDS = 1800
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

JobBuilder = Callable[[str, str], tuple[str, dict[str, Any]]]


def selected_nodes(selector: dict[str, str]) -> tuple[dict[str, NodeInfo], dict[str, NodeInfo]]:
    """(all known nodes, the Ready ones the selector picks)."""
    nodes = NODES.snapshot()
    return nodes, {n: i for n, i in nodes.items() if i.ready and i.matches(selector)}


def node_states(ctx: Context, role: str, wanted: dict[str, NodeInfo], build: JobBuilder) -> list[dict[str, Any]]:
    """One state per wanted node, creating the Jobs that are missing and deleting ours that are not wanted."""
    jobs = {j["metadata"]["name"]: j for j in list_children(ctx.owner, "batch/v1", "Job", role)}
    before = {n["name"]: n for n in ctx.previous.get("nodes") or []}
    states: list[dict[str, Any]] = []
    keep: set[str] = set()
    for name in sorted(wanted):
        _, job = build(name, wanted[name].uid)
        job_name = job["metadata"]["name"]
        keep.add(job_name)
        prev, live = before.get(name) or {}, jobs.get(job_name)
        if prev.get("job") == job_name and prev.get("phase") == st.PHASE_READY:
            states.append(prev)  # settled: the Job may be gone (TTL) and the verified result is recorded
        elif live is None:
            states.append(missing_job(ctx, name, job, role, prev))
        else:
            state = state_from_job(ctx, name, live, read_result=role == storage.ROLE_PRELOAD)
            if prev.get("job") == job_name and prev.get("recreations") and state["phase"] != st.PHASE_READY:
                state["recreations"] = prev["recreations"]  # so the next vanishing waits longer
            states.append(state)
    for job_name in jobs.keys() - keep:
        delete_job(ctx.owner.namespace, job_name)
    return states


def missing_job(ctx: Context, node: str, job: dict[str, Any], role: str, prev: dict[str, Any]) -> dict[str, Any]:
    """Create the node's Job, unless it is one we created that vanished before its result was recorded (a TTL
    shorter than our reading, someone deleting it): then back off exponentially, counting in status, instead of
    creating it again at once in a loop."""
    job_name = job["metadata"]["name"]
    ours = prev.get("job") == job_name and prev.get("phase") in (st.PHASE_PRELOADING, st.PHASE_FAILED)
    if not ours:
        return start_node_job(ctx, node, job, role)
    now = _now()
    recreations = int(prev.get("recreations") or 0)
    if retry_after := prev.get("retryAfter"):
        if now < _parse_time(retry_after):
            return prev
        state = start_node_job(ctx, node, job, role)
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


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _parse_time(value: str) -> datetime.datetime:
    return datetime.datetime.strptime(value, TIME_FORMAT).replace(tzinfo=datetime.UTC)


def start_node_job(ctx: Context, node: str, job: dict[str, Any], role: str) -> dict[str, Any]:
    job_name = job["metadata"]["name"]
    state: dict[str, Any] = {"name": node, "job": job_name}
    if problem := ctx.input_problem():
        return {**state, "phase": st.PHASE_PENDING, "message": problem.message}
    try:
        kube.apply(job)
    except ApiException as error:
        return {**state, "phase": st.PHASE_FAILED, "message": f"Job rejected: {api_error_message(error)}"}
    verb = "copies the model" if role == storage.ROLE_PRELOAD else "pulls the image"
    ctx.event(
        "Normal",
        "PreloadStarted" if role == storage.ROLE_PRELOAD else "PrePullStarted",
        f"Job {job_name} {verb} on {node}",
    )
    return {**state, "phase": st.PHASE_PRELOADING}


def state_from_job(ctx: Context, node: str, job: dict[str, Any], *, read_result: bool) -> dict[str, Any]:
    state: dict[str, Any] = {"name": node, "job": job["metadata"]["name"]}
    phase = st.job_phase(job)
    if phase == st.JOB_RUNNING:
        return {**state, "phase": st.PHASE_PRELOADING}
    if not read_result:
        if phase == st.JOB_SUCCEEDED:
            return {**state, "phase": st.PHASE_READY, "message": "image pulled"}
        return {**state, "phase": st.PHASE_FAILED, "message": st.job_failure_message(job)}
    result, error = job_result(ctx, job, succeeded=phase == st.JOB_SUCCEEDED)
    if error is not None or result is None:
        return {**state, "phase": st.PHASE_FAILED, "message": error or "no result"}
    return {
        **state,
        "phase": st.PHASE_READY,
        "bytes": result.bytes,
        "files": result.files,
        "seconds": round(result.seconds, 3),
        "message": f"verified copy: {result.files} files",
        "revision": result.revision,
    }


def sync_labels(ctx: Context, nodes: dict[str, NodeInfo], key: str, ready: set[str]) -> None:
    """`<key>=Ready` exactly on nodes with a verified copy; a merge patch only where that is not so yet."""
    for name, info in nodes.items():
        want = name in ready
        if want == (info.labels.get(key) == names.NODE_LABEL_READY):
            continue
        try:
            patch_node_label(name, key, names.NODE_LABEL_READY if want else None)
        except NotFoundError:
            continue


def reconcile_node_local(ctx: Context) -> Outcome:
    owner, spec = ctx.owner, ctx.spec
    local = storage.node_local(spec)
    key = names.node_label_key(owner.namespace, owner.name)
    nodes, wanted = selected_nodes(local.node_selector)
    states = node_states(ctx, storage.ROLE_PRELOAD, wanted, lambda n, uid: storage.node_preload(owner, spec, n, uid))
    sync_labels(ctx, nodes, key, {s["name"] for s in states if s["phase"] == st.PHASE_READY})
    revisions = [s.pop("revision") for s in states if "revision" in s]
    fields = node_fields(ctx, states, key)
    done = [s for s in states if s["phase"] == st.PHASE_READY and s.get("bytes") is not None]
    if done:
        fields.update(
            totalBytes=done[0]["bytes"],
            totalFiles=done[0]["files"],
            size=st.human_bytes(done[0]["bytes"]),
            resolvedRevision=revisions[0] if revisions else ctx.previous.get("resolvedRevision"),
        )
    if not wanted:
        message = f"no Ready node matches storage.nodeLocal.nodeSelector {local.node_selector or '{}'}"
        return Outcome(
            st.PHASE_PENDING,
            (False, "NoMatchingNodes", message),
            (False, "NoMatchingNodes", message),
            fields=fields,
        )
    return st.nodes_outcome(
        states,
        ready_reason="AllNodesReady",
        ready_message=f"pods select nodes with {key}=Ready",
        fields=fields,
    )


def node_fields(ctx: Context, states: list[dict[str, Any]], key: str | None) -> dict[str, Any]:
    request = fetch_request(ctx.spec, MODEL_MOUNT)
    fields: dict[str, Any] = {
        "nodes": states,
        "readyNodes": sum(1 for s in states if s["phase"] == st.PHASE_READY),
        "desiredNodes": len(states),
        "preloadHash": request_hash(ctx.spec, request),
        "volume": build_volume_snippet(ctx.owner, ctx.spec),
    }
    if key:
        fields["nodeLabel"] = key
    return fields


def reconcile_prepull(ctx: Context, fields: dict[str, Any], message: str) -> Outcome:
    """The volume works without a pre-pull, so the cache is Ready at once; pulls show as Progressing."""
    owner, spec = ctx.owner, ctx.spec
    pull = storage.image_volume(spec)
    _, wanted = selected_nodes(pull.node_selector)
    states = node_states(ctx, storage.ROLE_PREPULL, wanted, lambda n, uid: storage.node_prepull(owner, spec, n, uid))
    fields.update(
        nodes=states,
        readyNodes=sum(1 for s in states if s["phase"] == st.PHASE_READY),
        desiredNodes=len(states),
    )
    outcome = st.nodes_outcome(states, ready_reason="VolumeAvailable", ready_message=message, fields=fields)
    outcome.ready = (True, "VolumeAvailable", message)
    outcome.phase = st.PHASE_READY if outcome.phase != st.PHASE_FAILED or not states else st.PHASE_DEGRADED
    return outcome
