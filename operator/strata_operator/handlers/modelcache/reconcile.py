"""One level-based reconcile of a ModelCache: gather → plan → execute → write status only if it changed (the
shape of KVCacheTier's `handlers/kvcachetier/reconcile.py`).

Safe to run any number of times: the plan only writes children that are missing or different, status only
when the rendered status differs from the stored one, and Events only for what happened or changed. The
decisions are all in `resources/modelcache/plan.py`; this module carries them out.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from typing import Any

from kubernetes.dynamic.exceptions import ApiException, NotFoundError

from strata_operator import kube
from strata_operator.handlers.common import ensure_token_secret
from strata_operator.handlers.modelcache.io import delete_job, gather, patch_status
from strata_operator.handlers.modelcache.nodes import NodeCache, patch_node_label
from strata_operator.resources.core import Event, status_patch
from strata_operator.resources.modelcache import peers
from strata_operator.resources.modelcache import plan as planning
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.planner import Plan
from strata_operator.resources.runtime_image import RuntimeImage

ROUNDS = 3
"""A plan asks again at most twice per reconcile: once for the Job references, once for a created claim."""


def reconcile(
    body: Mapping[str, Any],
    previous: Mapping[str, Any],
    nodes: NodeCache,
    runtime: RuntimeImage,
    *,
    now: datetime.datetime | None = None,
    wake: Callable[[], None] | None = None,
) -> tuple[dict[str, Any], list[Event]]:
    """Returns (the status now stored, Events to post). `previous` is the status last seen or written; `wake`
    asks the daemon for another reconcile right after this one (when the plan says so)."""
    events: list[Event] = []
    inputs = False
    for _ in range(ROUNDS):
        observed = gather(body, previous, nodes, runtime, inputs=inputs, now=now)
        plan = planning.plan(observed)
        if plan.needs_inputs and not inputs:
            inputs = True  # discarded unexecuted: planned again with the references checked
            continue
        rejected = execute(plan, CacheRef.from_body(body), nodes, events)
        if rejected:  # say why in status; the refused writes are not planned again in this reconcile
            plan = planning.plan(planning.with_rejections(observed, rejected))
            break
        if not plan.again:
            break
    events += plan.events
    patch = status_patch(previous, plan.status)
    if patch is not None:
        patch_status(CacheRef.from_body(body), patch)
    if plan.wake_again and wake is not None:
        wake()
    return plan.status, events


def execute(plan: Plan, owner: CacheRef, nodes: NodeCache, events: list[Event]) -> dict[tuple[str, str], str]:
    """Carry out a plan's writes in order; returns what the API server refused, by (kind, name)."""
    rejected: dict[tuple[str, str], str] = {}
    skip: set[tuple[str, str]] = set()
    if plan.token_secret and (conflict := ensure_token_secret(owner, plan.token_secret)[1]):
        peer = peers.peer_name(owner)
        rejected[("DaemonSet", peer)] = conflict.message  # the peers need their token; everything else goes on
        skip = {("DaemonSet", peer), ("Service", peer), ("NetworkPolicy", peer)}
    for action in plan.actions:
        if action.key in skip:
            continue
        if action.verb == "delete":
            if delete_job(owner.namespace, action.key[1]) and action.event:
                events.append(action.event)
            continue
        try:
            kube.apply(action.body)
        except ApiException as error:
            rejected[action.key] = kube.api_error_message(error)
            continue
        if action.event:
            events.append(action.event)
    for change in plan.labels:
        try:
            if change.foreign:  # another cache's label: the node watch sees it and wakes that cache
                kube.merge_patch("v1", "Node", change.node, None, {"metadata": {"labels": {change.key: change.value}}})
                continue
            patch_node_label(nodes, change.node, change.key, change.value)
        except NotFoundError:
            continue
    return rejected
