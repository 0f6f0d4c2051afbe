"""Deleting a NodeLocal ModelCache: its copies live on nodes, outside Kubernetes' garbage collection.

The finalizer waits for a clean-up Job per node holding a copy. Whatever cannot be removed (a clean-up that
failed, a node that cannot run it, a deletion that gave up waiting, a namespace being deleted, in which no Job
can be created) is recorded on the node instead, so nobody loses track of it: a Warning Event on the Node and
the annotation `strata.dev/leftover.<namespace>.<name>: <path>`. Every clean-up Job the operator created is
deleted before the finalizer goes, except a failed one, which keeps its pod (and logs) for its TTL.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from kubernetes.dynamic.exceptions import ApiException, NotFoundError

from strata_operator import kube
from strata_operator.api.modelcache import DeletionPolicy, ModelCacheSpec
from strata_operator.handlers.modelcache.io import delete_job, list_children
from strata_operator.handlers.modelcache.node_cache import NodeCache, patch_node_annotation, patch_node_label
from strata_operator.resources.modelcache import names, storage
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.runtime_image import RuntimeImage

LEFT_BEHIND = "ModelCopyLeftBehind"
logger = logging.getLogger(__name__)


@dataclass
class Cleanup:
    """Where a deletion's clean-up stands, node by node."""

    path: str
    running: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    done: list[str] = field(default_factory=list)
    stuck: list[str] = field(default_factory=list)
    """Nodes that are not Ready: their Job cannot run, their copy stays for the node's owner."""
    namespace_terminating: bool = False
    node_uids: dict[str, str] = field(default_factory=dict)

    def left_behind(self) -> list[str]:
        """Nodes whose copy is still there (or may be) if the finalizer goes now."""
        return sorted(set(self.running) | set(self.failed) | set(self.stuck))


def namespace_terminating(error: ApiException) -> bool:
    """The API server refuses new objects in a namespace being deleted (403, cause NamespaceTerminating)."""
    if getattr(error, "status", None) != 403:
        return False
    try:
        body = json.loads(error.body)
    except (TypeError, ValueError):
        return False
    causes = (body.get("details") or {}).get("causes") or []
    return any(c.get("reason") == "NamespaceTerminating" for c in causes) or "being terminated" in str(
        body.get("message", "")
    )


def cleanup_node_copies(
    owner: CacheRef, spec: ModelCacheSpec, status: dict[str, Any], node_cache: NodeCache, runtime: RuntimeImage
) -> Cleanup:
    """On delete: stop preloads, unlabel nodes, and (policy Delete) run a clean-up Job per node with a copy."""
    state = Cleanup(path=storage.node_copy_path(owner, spec))
    for job in list_children(owner, "batch/v1", "Job", storage.ROLE_PRELOAD):
        delete_job(owner.namespace, job["metadata"]["name"])
    key = names.node_label_key(owner.namespace, owner.name)
    nodes = node_cache.snapshot()
    holders = {n for n, i in nodes.items() if key in i.labels}
    holders |= {s["name"] for s in status.get("nodes") or [] if s["name"] in nodes}
    state.node_uids = {n: nodes[n].uid for n in holders}
    for name in sorted(holders):
        if key in nodes[name].labels:
            with contextlib.suppress(NotFoundError):
                patch_node_label(node_cache, name, key, None)
    if spec.deletion_policy == DeletionPolicy.RETAIN:
        return state
    for name in sorted(holders):
        job = storage.node_cleanup(owner, spec, name, runtime)
        live = kube.read("batch/v1", "Job", job["metadata"]["name"], owner.namespace)
        if live is None and not state.namespace_terminating:
            try:
                kube.apply(job)
            except ApiException as error:
                if not namespace_terminating(error):
                    raise
                state.namespace_terminating = True
            live = job
        phase = st.job_phase(live)
        if phase == st.JOB_SUCCEEDED:
            state.done.append(name)
        elif phase == st.JOB_FAILED:
            state.failed.append(name)
        elif not nodes[name].ready:
            state.stuck.append(name)
        else:
            state.running.append(name)
    if state.namespace_terminating:  # nothing created in it can run: every copy not yet removed stays
        state.stuck = sorted(set(state.stuck) | set(state.running))
        state.running = []
    return state


def unlabel_nodes(owner: CacheRef, node_cache: NodeCache) -> None:
    """ImageVolume on delete: its pre-pull Jobs and their pods go with the cache (ownerReferences); the node
    labels are removed here. The image a pre-pull left in the runtime's store stays: it is content the runtime
    shares (another cache or pod may use the same layers), removing it would take a privileged pod with the
    runtime's socket, and the kubelet's image garbage collection removes images no pod uses when the disk fills."""
    key = names.node_label_key(owner.namespace, owner.name)
    for name, info in sorted(node_cache.snapshot().items()):
        if key in info.labels:
            with contextlib.suppress(NotFoundError):
                patch_node_label(node_cache, name, key, None)


def finish_cleanup(owner: CacheRef, state: Cleanup) -> list[tuple[str, str]]:
    """Before the finalizer goes: delete our clean-up Jobs (a failed one stays for its TTL, to be read), clear
    the leftover record where the copy is gone, set it (annotation and Warning Event) where it stays.
    Returns (node, message) for each copy left behind."""
    failed_jobs = {storage.node_cleanup_job_name(owner, node) for node in state.failed}
    for job in list_children(owner, "batch/v1", "Job", storage.ROLE_CLEANUP):
        if job["metadata"]["name"] not in failed_jobs:
            delete_job(owner.namespace, job["metadata"]["name"])
    key = names.leftover_annotation_key(owner.namespace, owner.name)
    for node in state.done:
        with contextlib.suppress(NotFoundError):
            patch_node_annotation(node, key, None)
    warnings = []
    for node in state.left_behind():
        with contextlib.suppress(NotFoundError):
            patch_node_annotation(node, key, state.path)
        why = "its clean-up Job failed" if node in state.failed else "no clean-up Job could run"
        if state.namespace_terminating:
            why = f"namespace {owner.namespace} is being deleted, so no clean-up Job could be created there"
        message = (
            f"ModelCache {owner.namespace}/{owner.name} was deleted but its copy at {state.path} on this node was "
            f"not removed ({why}): remove that directory, then the annotation {key}"
        )
        warnings.append((node, message))
        if not kube.post_node_event(node, state.node_uids.get(node, ""), "Warning", LEFT_BEHIND, message):
            logger.warning("could not post an Event on node %s: %s", node, message)
    return warnings
