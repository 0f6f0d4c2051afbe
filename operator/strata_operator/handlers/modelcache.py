"""kopf handlers for the modelcache resource (thin: parse spec, build children, apply, set status).

One daemon per ModelCache runs the level-based reconcile, serialised per object. Watches on its children
(Jobs, their pods, claims) and on nodes only wake the daemon, so bursts of events collapse into one reconcile;
a periodic resync repairs anything no watch reported.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, cast

import kopf
from pydantic import ValidationError

from strata_operator.api import GROUP, VERSION
from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.handlers.modelcache_cleanup import cleanup_node_copies, finish_cleanup
from strata_operator.handlers.modelcache_nodes import NodeCache
from strata_operator.handlers.modelcache_reconcile import reconcile
from strata_operator.resources.modelcache.names import CACHE_LABEL, node_label_key
from strata_operator.resources.modelcache.owner import CacheRef

PLURAL = "modelcaches"
RESYNC_SECONDS = float(os.environ.get("STRATA_MODELCACHE_RESYNC_SECONDS", "60"))
DEBOUNCE_SECONDS = 0.5
"""A finishing pod brings a burst of events (pod, Job, Job again): gather them into one reconcile."""
CLEANUP_ATTEMPTS = 150
"""About five minutes of 2-second retries before a deletion stops waiting for clean-up Jobs."""


class Waker:
    """Wakes one cache's daemon; `uses_nodes` says whether node changes concern it."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.uses_nodes = True


@dataclass
class ModelCacheMemory:
    """What the controller keeps between events: the node cache, one waker per running daemon, the threads the
    (blocking) reconciles run on. It lives on kopf's operator memo, set at startup, so every operator run (and
    every test) has its own and no module holds state."""

    nodes: NodeCache = field(default_factory=NodeCache)
    wakers: dict[tuple[str, str], Waker] = field(default_factory=dict)
    executor: concurrent.futures.ThreadPoolExecutor = field(
        default_factory=lambda: concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="modelcache")
    )

    def wake(self, namespace: str | None, name: str | None) -> None:
        waker = self.wakers.get((namespace or "", name or ""))
        if waker is not None:
            waker.event.set()


@kopf.on.startup()
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


@kopf.daemon(GROUP, VERSION, PLURAL, cancellation_timeout=10)
async def modelcache_daemon(
    body: kopf.Body, meta: kopf.Meta, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **_: Any
) -> None:
    """Reconcile now, then whenever a watch wakes us or the resync interval passes. A failed reconcile backs
    off, but a change to the cache (a fixed spec) or its children ends the wait at once."""
    mine = memory(memo)
    key = (meta["namespace"], meta["name"])
    waker = mine.wakers.setdefault(key, Waker())
    loop = asyncio.get_running_loop()
    previous: dict[str, Any] = copy.deepcopy(dict(body.get("status") or {}))
    failures = 0
    try:
        while not stopped:
            waker.event.clear()
            snapshot = copy.deepcopy(dict(body))
            waker.uses_nodes = uses_nodes(snapshot.get("spec") or {})
            try:
                previous, events = await loop.run_in_executor(mine.executor, reconcile, snapshot, previous, mine.nodes)
            except Exception as error:  # an API hiccup must not end the daemon: back off and try again
                failures += 1
                logger.exception(f"reconcile failed (attempt {failures})")
                if failures in (1, 5, 20):
                    kopf.warn(body, reason="ReconcileError", message=f"{type(error).__name__}: {error}")
                await _sleep(waker.event, stopped, min(60.0, 2.0**failures))
                continue
            failures = 0
            for type_, reason, message in events:
                kopf.event(body, type=type_, reason=reason, message=message)
            if await _sleep(waker.event, stopped, RESYNC_SECONDS):
                await stopped.wait(DEBOUNCE_SECONDS)
    finally:
        if mine.wakers.get(key) is waker:
            del mine.wakers[key]


async def _sleep(event: asyncio.Event, stopped: kopf.DaemonStopped, timeout: float) -> bool:
    """Wait for a wake-up, the stop flag or the resync interval; True when it was a wake-up."""
    waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    return event.is_set()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def modelcache_changed(meta: kopf.Meta, status: kopf.Status, memo: kopf.Memo, **_: Any) -> None:
    """A spec change (new generation) wakes the daemon; our own status writes do not."""
    if meta.get("generation") != status.get("observedGeneration"):
        memory(memo).wake(meta.get("namespace"), meta.get("name"))


@kopf.on.event("batch", "v1", "jobs", labels={CACHE_LABEL: kopf.PRESENT})
@kopf.on.event("", "v1", "persistentvolumeclaims", labels={CACHE_LABEL: kopf.PRESENT})
async def child_changed(meta: kopf.Meta, labels: Mapping[str, str], memo: kopf.Memo, **_: Any) -> None:
    memory(memo).wake(meta.get("namespace"), labels.get(CACHE_LABEL))


@kopf.on.event("", "v1", "pods", labels={CACHE_LABEL: kopf.PRESENT})
async def pod_changed(
    event: Mapping[str, Any],
    meta: kopf.Meta,
    status: kopf.Status,
    labels: Mapping[str, str],
    memo: kopf.Memo,
    **_: Any,
) -> None:
    """Only an ended pod carries news (its termination message); a pending pod's scheduling retries do not."""
    if event.get("type") == "DELETED" or status.get("phase") in ("Succeeded", "Failed"):
        memory(memo).wake(meta.get("namespace"), labels.get(CACHE_LABEL))


@kopf.on.event("", "v1", "nodes")
async def node_changed(event: Mapping[str, Any], body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    mine = memory(memo)
    change = mine.nodes.observe(body, deleted=event.get("type") == "DELETED")
    for (namespace, name), waker in list(mine.wakers.items()):
        concerned = change.placement and waker.uses_nodes
        if concerned or (change.model_labels and node_label_key(namespace, name) in change.model_labels):
            waker.event.set()


@kopf.on.delete(GROUP, VERSION, PLURAL)
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

    Claims, Jobs and everything else with an ownerReference are left to the garbage collector. The finalizer
    never outstays what can still happen: in a namespace being deleted no clean-up Job can be created, so the
    deletion gives up at once; otherwise it waits about five minutes. Copies left behind are recorded on their
    nodes (see `modelcache_cleanup`).
    """
    try:
        parsed = ModelCacheSpec.model_validate(dict(spec))
    except ValidationError:
        return
    if parsed.storage.mode != StorageMode.NODE_LOCAL:
        return
    owner = CacheRef.from_body(body)
    state = cleanup_node_copies(owner, parsed, dict(status), memory(memo).nodes)
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
