"""What kopf calls for ModelCache (the triggers are listed in `strata_operator.routes`).

One daemon per ModelCache runs the level-based reconcile (`controller`, the daemon and loop both kinds share).
Watches on the cache, its children (Jobs, their pods, claims), its consumer pods and on nodes only wake it.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf
from pydantic import ValidationError

from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.handlers import controller
from strata_operator.handlers.modelcache.cleanup import cleanup_node_copies, finish_cleanup, unlabel_nodes
from strata_operator.handlers.modelcache.node_cache import NodeCache
from strata_operator.handlers.modelcache.reconcile import reconcile
from strata_operator.handlers.process import runtime_of, settings_of
from strata_operator.resources.core import MODEL_CACHE_LABEL
from strata_operator.resources.modelcache.compile_cache import restore_report
from strata_operator.resources.modelcache.image import RESOLVE_ANNOTATION
from strata_operator.resources.modelcache.names import CACHE_LABEL, node_label_key
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.status import PHASE_EVICTED, pull_failure

PLURAL = "modelcaches"
CACHE_CHILD = {CACHE_LABEL: kopf.PRESENT}
"""Jobs, their pods, claims and peer DaemonSets of any cache carry this label."""
CLEANUP_ATTEMPTS = 150
"""About five minutes of 2-second retries before a deletion stops waiting for clean-up Jobs."""


@dataclass
class ModelCacheMemory(controller.Memory):
    """The ModelCache controller's memory (see `controller`), plus the node cache its plans read."""

    name: str = "modelcache"
    nodes: NodeCache = field(default_factory=NodeCache)


def remember(memo: kopf.Memo, **_: Any) -> None:
    memo.modelcaches = ModelCacheMemory()


def memory(memo: kopf.Memo) -> ModelCacheMemory:
    return cast(ModelCacheMemory, memo.modelcaches)


def uses_nodes(spec: Mapping[str, Any]) -> bool:
    storage = spec.get("storage") or {}
    return bool(
        storage.get("mode") == StorageMode.NODE_LOCAL
        or (storage.get("mode") == StorageMode.IMAGE_VOLUME and (storage.get("imageVolume") or {}).get("prePull"))
    )


async def modelcache_daemon(
    body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **kwargs: Any
) -> None:
    """The cache's reconcile loop (`controller.run_daemon`); the status it last wrote is carried between runs."""
    mine, process = memory(memo), settings_of(memo)
    previous: dict[str, Any] = copy.deepcopy(dict(body.get("status") or {}))
    index = kwargs[controller.MODEL_CACHES.index]
    key = (body["metadata"]["namespace"], body["metadata"]["name"])

    def reconcile_once(snapshot: dict[str, Any], waker: controller.Waker, _full: bool) -> list[Any]:
        nonlocal previous
        waker.tags["uses_nodes"] = uses_nodes(snapshot.get("spec") or {})
        consumers = controller.count_consumers(index, waker, key)
        previous, events = reconcile(
            snapshot,
            previous,
            mine.nodes,
            runtime_of(process),
            wake=waker.wake,
            recheck=waker.recheck_in,
            consumers=consumers,
        )
        waker.tags["evicted"] = any(n.get("phase") == PHASE_EVICTED for n in previous.get("nodes") or [])
        return events

    await controller.run_daemon(
        mine, body, stopped, logger, reconcile_once, resync_seconds=process.modelcache_resync_seconds
    )


async def modelcache_changed(meta: kopf.Meta, status: kopf.Status, memo: kopf.Memo, **_: Any) -> None:
    """A spec change (new generation) wakes the daemon, and so does a new value of the annotation that asks an
    ImageVolume to resolve its tag again; our own status writes do not."""
    asked = (meta.get("annotations") or {}).get(RESOLVE_ANNOTATION)
    answered = (status.get("image") or {}).get("resolveRequest")
    if meta.get("generation") != status.get("observedGeneration") or (asked or None) != (answered or None):
        memory(memo).wake(meta.get("namespace"), meta.get("name"))


async def child_changed(meta: kopf.Meta, labels: Mapping[str, str], memo: kopf.Memo, **_: Any) -> None:
    memory(memo).wake(meta.get("namespace"), labels.get(CACHE_LABEL))


async def pod_changed(
    event: Mapping[str, Any],
    meta: kopf.Meta,
    status: kopf.Status,
    labels: Mapping[str, str],
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Only an ended pod carries news (its termination message), or a pod whose image the kubelet cannot pull (a
    pre-pull's result); a pending pod's scheduling retries do not."""
    if (
        event.get("type") == "DELETED"
        or status.get("phase") in ("Succeeded", "Failed")
        or pull_failure([{"status": dict(status)}]) is not None
    ):
        memory(memo).wake(meta.get("namespace"), labels.get(CACHE_LABEL))


async def consumer_changed(
    meta: kopf.Meta, status: kopf.Status, labels: Mapping[str, str], memo: kopf.Memo, **kwargs: Any
) -> None:
    """A consumer pod's event wakes its cache when the count of live consumers moved (status.consumers), or when
    the pod has not started and the cache has an evicted copy: the pod may need it back
    (`resources/modelcache/demand.py`). Other pod events (a running pod's status) wake nobody."""
    key = (meta.get("namespace") or "", labels[MODEL_CACHE_LABEL])
    waker = memory(memo).wakers.get(key)
    if waker is None:
        return
    waiting = status.get("phase", "Pending") == "Pending" and not meta.get("deletionTimestamp")
    if (
        controller.consumers_moved(kwargs[controller.MODEL_CACHES.index], waker, key)
        or (waiting and waker.tags.get("evicted"))
        or new_restore_report(waker, meta, status)
    ):
        waker.wake()


def new_restore_report(waker: controller.Waker, meta: kopf.Meta, status: kopf.Status) -> bool:
    """The pod's compile cache restore ended since the cache last heard of it (status.compileCache counts it)."""
    if restore_report({"status": status}) is None:
        return False
    seen: set[str] = waker.tags.setdefault("compile_reports", set())
    uid = str(meta.get("uid") or meta.get("name"))
    if uid in seen:
        return False
    if len(seen) >= REPORTS_REMEMBERED:  # forgetting only costs a reconcile that changes nothing
        seen.clear()
    seen.add(uid)
    return True


REPORTS_REMEMBERED = 4096


async def node_changed(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    mine = memory(memo)
    change = mine.nodes.observe(body, deleted=event.get("type") == "DELETED")
    for (namespace, name), waker in list(mine.wakers.items()):
        concerned = change.placement and waker.tags.get("uses_nodes", True)
        if concerned or (change.model_labels and node_label_key(namespace, name) in change.model_labels):
            waker.wake()


def modelcache_deleted(
    body: kopf.Body,
    spec: kopf.Spec,
    status: kopf.Status,
    retry: int,
    memo: kopf.Memo,
    logger: kopf.Logger,
    **_: Any,
) -> None:
    """NodeLocal copies live outside Kubernetes' garbage collection: remove them before the finalizer goes.
    ImageVolume leaves only its node labels to remove: a pulled image is the kubelet's (its image garbage
    collection removes unused images; see `handlers/modelcache/cleanup.unlabel_nodes`).

    Claims, Jobs and everything else with an ownerReference are left to the garbage collector. The finalizer
    never outstays what can still happen: in a namespace being deleted no clean-up Job can be created, so the
    deletion gives up at once; otherwise it waits about five minutes. Copies left behind are recorded on their
    nodes (see `handlers/modelcache/cleanup.py`).
    """
    try:
        parsed = ModelCacheSpec.model_validate(dict(spec))
    except ValidationError:
        return
    owner = CacheRef.from_body(body)
    if parsed.storage.mode == StorageMode.IMAGE_VOLUME:
        unlabel_nodes(owner, memory(memo).nodes)
        return
    if parsed.storage.mode != StorageMode.NODE_LOCAL:
        return
    state = cleanup_node_copies(owner, parsed, dict(status), memory(memo).nodes, runtime_of(settings_of(memo)))
    if state.running and retry < CLEANUP_ATTEMPTS:
        raise kopf.TemporaryError(f"waiting for clean-up Jobs on {', '.join(state.running)}", delay=2)
    if state.namespace_terminating:
        logger.warning(f"namespace {owner.namespace} is being deleted: no clean-up Job can be created there")
    else:  # an Event in a namespace being deleted would be refused
        for node in state.failed:
            kopf.warn(
                body, reason="CleanupFailed", message=f"clean-up Job on node {node} failed; remove the copy by hand"
            )
        if state.running:
            kopf.warn(
                body, reason="CleanupTimedOut", message=f"gave up waiting for clean-up on {', '.join(state.running)}"
            )
    for node, message in finish_cleanup(owner, state):
        logger.warning(f"node {node}: {message}")
