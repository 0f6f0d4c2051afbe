"""What kopf calls for KVCacheTier (the triggers are listed in `strata_operator.routes`): one daemon per tier
runs its level-based reconcile (`controller`, the same for both kinds); watches only wake it:

- the tier itself: a new generation (a spec change) asks for a full reconcile;
- its children (DaemonSet, ConfigMaps, Service, PVC): a hand edit or deletion is put back (full), a DaemonSet
  status change (pods becoming ready) only refreshes the status, our own writes wake nobody;
- its consumer pods: a status refresh when their live count moved (status.consumers);
- the resync: the safety net for anything a missed watch event would leave behind, and the time to scrape
  the servers' usage.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import kopf

from strata_operator.api import GROUP
from strata_operator.handlers import controller
from strata_operator.handlers.kvcachetier import reconcile as reconciler
from strata_operator.handlers.process import settings_of
from strata_operator.resources.core import KV_TIER_LABEL, MANAGED_BY, MANAGED_BY_LABEL
from strata_operator.resources.kvcachetier.names import APP_NAME, KIND, NAME_LABEL

PLURAL = "kvcachetiers"
RESYNC_SECONDS = 60.0
USAGE_INTERVAL_SECONDS = 60.0
"""How often the servers' metrics are scraped into status.usage (informative, never urgent)."""
CHILD_LABELS = {MANAGED_BY_LABEL: MANAGED_BY, NAME_LABEL: APP_NAME}


@dataclass
class TierMemory(controller.Memory):
    """The KVCacheTier controller's memory (see `controller`), plus the versions its applies left."""

    name: str = "kvcachetier"
    applied: reconciler.AppliedChildren = field(default_factory=dict)
    offload: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(namespace, name) → the tier's status.offload as last reconciled, for the operator's /metrics."""


def remember_tiers(memo: kopf.Memo, **_: Any) -> None:
    memo.kvcachetiers = TierMemory()


def memory(memo: kopf.Memo) -> TierMemory:
    return cast(TierMemory, memo.kvcachetiers)


async def tier_daemon(
    body: kopf.Body, memo: kopf.Memo, stopped: kopf.DaemonStopped, logger: kopf.Logger, **kwargs: Any
) -> None:
    """The tier's reconcile loop; its Events are posted on kopf's loop (`controller.run_daemon`)."""
    mine, process = memory(memo), settings_of(memo)
    scraped = 0.0
    index = kwargs[controller.KV_TIERS.index]

    def reconcile_once(snapshot: dict[str, Any], waker: controller.Waker, full: bool) -> list[Any]:
        nonlocal scraped
        scrape = time.monotonic() - scraped >= USAGE_INTERVAL_SECONDS
        if scrape:
            scraped = time.monotonic()
        consumers = controller.count_consumers(index, waker, key)
        outcome = reconciler.reconcile(
            snapshot, full=full, settings=process, applied=mine.applied, scrape=scrape, consumers=consumers
        )
        if outcome is not None and outcome.status.get("offload"):
            mine.offload[key] = outcome.status["offload"]
        return outcome.events if outcome is not None else []

    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    try:
        await controller.run_daemon(mine, body, stopped, logger, reconcile_once, resync_seconds=RESYNC_SECONDS)
    finally:
        mine.offload.pop(key, None)  # the tier is gone (or this replica stopped): no stale gauges


async def tier_changed(meta: kopf.Meta, status: kopf.Status, memo: kopf.Memo, **_: Any) -> None:
    """A spec change (new generation) wakes the daemon; our own status writes do not."""
    if meta.get("generation") != status.get("observedGeneration"):
        memory(memo).wake(meta.get("namespace"), meta.get("name"))


async def consumer_changed(meta: kopf.Meta, labels: Mapping[str, str], memo: kopf.Memo, **kwargs: Any) -> None:
    """A consumer pod's event: a status refresh of its tier when the count of live consumers moved."""
    key = (meta.get("namespace") or "", labels[KV_TIER_LABEL])
    waker = memory(memo).wakers.get(key)
    if waker is not None and controller.consumers_moved(kwargs[controller.KV_TIERS.index], waker, key):
        waker.wake(full=False)


def owning_tier(body: Mapping[str, Any]) -> str | None:
    """The KVCacheTier that controls this child, if any."""
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/") and ref.get("controller"):
            return str(ref["name"])
    return None


def child_event_action(
    event_type: str | None, body: Mapping[str, Any], applied: reconciler.AppliedChildren
) -> Literal["skip", "status", "full"]:
    """What a child's watch event asks for.

    Our own creations (ADDED) and writes (the resourceVersion our apply returned) need nothing; a
    DaemonSet whose spec generation is still ours only changed status (pods becoming ready); anything
    else — a deletion, a hand edit — re-applies the children.
    """
    if event_type in (None, "ADDED"):  # None: the initial listing, which each daemon's first reconcile covers
        return "skip"
    if event_type == "DELETED":
        return "full"
    meta = body.get("metadata", {})
    known = applied.get((body.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")))
    if known is None:
        return "full"
    if meta.get("resourceVersion") == known.resource_version:
        return "skip"
    if body.get("kind") == "DaemonSet" and int(meta.get("generation") or 0) == known.generation:
        return "status"
    return "full"


async def child_changed(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    """A child's watch event: wake its tier when `child_event_action` says the event is news."""
    owner = owning_tier(body)
    mine = memory(memo)
    action = child_event_action(event.get("type"), body, mine.applied)
    if owner is not None and action != "skip":
        mine.wake(body["metadata"]["namespace"], owner, full=action == "full")
