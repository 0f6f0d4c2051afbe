"""NodeLocal (a copy per selected node, fanned out from the first) and ImageVolume (pods mount an image; optional
pre-pulls), both planned from per-node states (`node_states`).
"""

from __future__ import annotations

from typing import Any

from strata_units import format_bytes

from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.modelcache import fanout, image, names, node_loss, storage
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache.draft import Planner
from strata_operator.resources.modelcache.jobs import MODEL_MOUNT, fetch_request, request_hash
from strata_operator.resources.modelcache.node_states import (
    label_changes,
    needed_again,
    node_states,
    selected_nodes,
)
from strata_operator.resources.modelcache.status import Outcome
from strata_operator.resources.modelcache.volume import image_volume_snippet, node_local_snippet


def plan_node_local(planner: Planner, spec: ModelCacheSpec) -> Outcome:
    observed = planner.observed
    owner = observed.owner
    local = storage.node_local(spec)
    key = names.node_label_key(owner.namespace, owner.name)
    wanted = selected_nodes(observed.nodes, local.node_selector)
    planner.node_label = key
    fan = fanout.decide(
        owner, spec, wanted, observed.previous, observed.jobs, observed.peers, observed.now, observed.runtime
    )
    planner.build = lambda node: fan.builder(node, wanted[node].uid)[1]
    planner.needed_again = needed_again(planner, wanted)
    starting = {n: info for n, info in wanted.items() if n not in fan.waiting}
    lost = node_loss.lost_nodes(observed.nodes, local.node_selector, observed.previous)
    found = node_states(planner, storage.ROLE_PRELOAD, starting, fan.builder, lost)
    waiting = [{"name": n, "phase": fanout.NODE_WAITING, "message": m} for n, m in fan.waiting.items()]
    states = sorted(found.states + waiting, key=lambda s: str(s["name"]))
    _fan_out_children(planner, fan)
    before = {n["name"]: n.get("phase") for n in observed.previous.get("nodes") or []}
    if fan.status is not None and any(
        s["phase"] == st.PHASE_READY and before.get(s["name"]) != st.PHASE_READY for s in states
    ):
        planner.wake_again = True
    ready = _copies(states)
    planner.labels = label_changes(observed.nodes, key, ready) + planner.labels  # + other caches' evictions
    fields = _node_fields(planner, spec, states)
    fields["nodeLabel"] = key
    if fan.status is not None:
        fields["fanOut"] = fan.status
    done = [s for s in states if s["phase"] == st.PHASE_READY and s.get("bytes") is not None]
    if done:
        revisions = list(found.revisions.values())
        fields.update(
            totalBytes=done[0]["bytes"],
            totalFiles=done[0]["files"],
            size=format_bytes(done[0]["bytes"], approximate=True),
            resolvedRevision=revisions[0] if revisions else observed.previous.get("resolvedRevision"),
            # What the spec asked when that commit was resolved: later nodes copy the same commit (fanout).
            resolvedFrom=(spec.source.revision or "") if revisions else observed.previous.get("resolvedFrom"),
        )
    if not wanted and not lost:
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


def _copies(states: list[dict[str, Any]]) -> set[str]:
    """The nodes that hold a Ready copy (or pre-pulled image), those that are not Ready now included
    (`node_loss`): the nodes that carry the cache's `=Ready` label."""
    return {s["name"] for s in states if st.PHASE_READY in (s["phase"], (s.get(node_loss.BEFORE) or {}).get("phase"))}


def _fan_out_children(planner: Planner, fan: fanout.Decision) -> None:
    """Apply the peer objects that differ; a refusal is told in the fan-out status (the other nodes then wait,
    and read the source after `peerWaitSeconds`)."""
    planner.token_secret = fan.token_secret
    for body in fan.apply:
        if (refusal := planner.create(body, None)) and fan.status is not None:
            fan.status["message"] = f"{body['kind']} {body['metadata']['name']}: {refusal}"


def _node_fields(planner: Planner, spec: ModelCacheSpec, states: list[dict[str, Any]]) -> dict[str, Any]:
    """Roll-up fields; `preloadHash` fingerprints the fetch request itself (each node's Job adds its node)."""
    return {
        "nodes": states,
        "readyNodes": sum(1 for s in states if s["phase"] == st.PHASE_READY),
        "desiredNodes": len(states),
        "preloadHash": request_hash(spec, fetch_request(spec, MODEL_MOUNT), runtime=planner.observed.runtime),
        "volume": node_local_snippet(planner.observed.owner, spec),
    }


def plan_image_volume(planner: Planner, spec: ModelCacheSpec) -> Outcome:
    """Nothing to download: pods mount the image at the digest its tag was resolved to (`image`); optional
    pre-pull Jobs warm the nodes, which get the same Ready label as NodeLocal copies."""
    observed = planner.observed
    owner = observed.owner
    pinned_image = image.image_status(observed.previous, observed.image, observed.resolve_request, observed.now)
    pinned = pinned_image.get("reference") if pinned_image.get("digest") else None
    key = names.node_label_key(owner.namespace, owner.name)
    fields: dict[str, Any] = {"image": pinned_image or None}
    failure = image.failure_of(observed.image) or _failure_in_force(pinned_image)
    retrying = bool(failure and pinned_image.get("transient"))  # it may pass by itself: not for a person yet
    retry = f"; trying again after {pinned_image.get('nextAttempt')}" if pinned_image.get("nextAttempt") else ""
    if pinned is None:
        planner.labels = label_changes(observed.nodes, key, set())
        if failure is None:  # unreachable after a gather: it looks up whatever is not pinned
            message = f"resolving {storage.image_reference(spec)}"
            return Outcome(st.PHASE_PENDING, (False, "Resolving", message), (True, "Resolving", message), fields=fields)
        reason, message = failure
        return Outcome(
            st.PHASE_DEGRADED,
            (False, reason, message),
            (retrying, reason, f"{message}{retry}"),
            (True, reason, message),
            fields=fields,
        )
    fields.update(volume=image_volume_snippet(owner, spec, pinned), **image.size_fields(pinned_image))
    message = f"pods mount {pinned} as an image volume"
    pull = storage.image_volume(spec)
    if not pull.pre_pull:
        planner.labels = label_changes(observed.nodes, key, set())
        outcome = Outcome(
            phase=st.PHASE_READY,
            ready=(True, "VolumeAvailable", message),
            reconciling=(False, "VolumeAvailable", "nothing to download"),
            fields=fields,
        )
        return _with_image_failure(outcome, failure, retry if retrying else None)
    # The volume works without a pre-pull, so the cache is Ready at once; pulls show as Reconciling.
    wanted = selected_nodes(observed.nodes, pull.node_selector)

    def prepull(node: str, node_uid: str) -> tuple[str, dict[str, Any]]:
        return storage.node_prepull(owner, spec, node, node_uid, observed.runtime, pinned=pinned)

    lost = node_loss.lost_nodes(observed.nodes, pull.node_selector, observed.previous)
    states = node_states(planner, storage.ROLE_PREPULL, wanted, prepull, lost).states
    planner.labels = label_changes(observed.nodes, key, _copies(states))
    fields.update(
        nodes=states,
        readyNodes=sum(1 for s in states if s["phase"] == st.PHASE_READY),
        desiredNodes=len(states),
        nodeLabel=key,
    )
    outcome = st.nodes_outcome(states, ready_reason="VolumeAvailable", ready_message=message, fields=fields)
    outcome.ready = (True, "VolumeAvailable", message)
    if outcome.degraded[0]:
        outcome.phase = st.PHASE_DEGRADED
        if outcome.degraded[1] == "NodePreloadFailed":
            outcome.degraded = (True, "PrePullFailed", outcome.degraded[2])
    else:
        outcome.phase = st.PHASE_READY
    return _with_image_failure(outcome, failure, retry if retrying else None)


def _failure_in_force(pinned_image: dict[str, Any]) -> tuple[str, str] | None:
    """A failed resolution recorded earlier, still waiting for its next attempt."""
    if not pinned_image.get("failures"):
        return None
    return str(pinned_image.get("reason") or "RegistryError"), str(pinned_image.get("message") or "")


def _with_image_failure(outcome: Outcome, failure: tuple[str, str] | None, retry: str | None) -> Outcome:
    """A re-resolution that failed while an earlier pin serves: still Ready (on the old digest), but Degraded;
    Reconciling while a transient failure waits for its next attempt (`retry`, None for any other failure, which
    is Stalled: a person must look)."""
    if failure is None or outcome.degraded[0]:
        return outcome
    reason, message = failure
    outcome.degraded = (True, reason, f"{message}; pods keep mounting the digest resolved before")
    outcome.phase = st.PHASE_DEGRADED
    if retry is not None and not outcome.reconciling[0]:
        outcome.reconciling = (True, reason, f"{message}{retry}")
    return outcome
