"""`status.consumers`: how many live pods name each ModelCache and KVCacheTier in their opt-in label.

Two kopf indexes hold the labelled pods that have not ended, keyed by (namespace, name of the cache or tier). A
pod event recounts its one cache or tier; an event of the cache or tier itself repairs a count that is missing
or stale (a new object, or a status rewrite that dropped the field). A write happens only when the stored count
differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any

import kopf
from kubernetes.dynamic.exceptions import NotFoundError

from strata_operator import kube
from strata_operator.api import API_VERSION
from strata_operator.resources.core import KV_TIER_LABEL, MODEL_CACHE_LABEL

ENDED = ("Succeeded", "Failed")


def _live(status: Mapping[str, Any], meta: Mapping[str, Any]) -> bool:
    return status.get("phase") not in ENDED and not meta.get("deletionTimestamp")


def count(index: kopf.Index[tuple[str, str], str], namespace: str | None, name: str) -> int:
    """Indexes arrive as keyword arguments named after their functions."""
    return len(index.get((namespace or "", name), []))


def write_consumers(kind: str, namespace: str | None, name: str, consumers: int) -> None:
    """Patch status.consumers unless it already says so (a missing object has no one to tell)."""
    api = kube.dynamic_client().resources.get(api_version=API_VERSION, kind=kind)
    try:
        live = api.get(name=name, namespace=namespace).to_dict()
        if (live.get("status") or {}).get("consumers") == consumers:
            return
        api.status.patch(
            body={"status": {"consumers": consumers}},
            name=name,
            namespace=namespace,
            content_type="application/merge-patch+json",
        )
    except NotFoundError:
        return


@dataclass(frozen=True)
class Consumed:
    """A kind pods opt into by a label, and the kopf index of its live consumers (passed to handlers by `index`)."""

    kind: str
    plural: str
    label: str
    index: str

    @property
    def selector(self) -> dict[str, Any]:
        """The pods that opt in: any value of the label."""
        return {self.label: kopf.PRESENT}


MODEL_CACHES = Consumed("ModelCache", "modelcaches", MODEL_CACHE_LABEL, "model_cache_consumers")
KV_TIERS = Consumed("KVCacheTier", "kvcachetiers", KV_TIER_LABEL, "kv_tier_consumers")


def index_of(consumed: Consumed) -> Callable[..., dict[tuple[str, str], str] | None]:
    """The kopf index of `consumed`'s live consumer pods: (namespace, cache or tier) -> pod name."""

    def consumers(
        namespace: str | None, name: str, labels: Mapping[str, str], status: kopf.Status, meta: kopf.Meta, **_: Any
    ) -> dict[tuple[str, str], str] | None:
        return {(namespace or "", labels[consumed.label]): name} if _live(status, meta) else None

    return consumers


def recount_of(consumed: Consumed) -> Callable[..., Awaitable[None]]:
    """On a consumer pod's event: recount the one cache or tier it names."""

    async def recount(namespace: str | None, labels: Mapping[str, str], **kwargs: Any) -> None:
        target = labels[consumed.label]
        live = count(kwargs[consumed.index], namespace, target)
        await asyncio.to_thread(write_consumers, consumed.kind, namespace, target, live)

    return recount


def repair_of(consumed: Consumed) -> Callable[..., Awaitable[None]]:
    """On the cache's or tier's own event: write the count where it is missing or stale."""

    async def repair(
        event: Mapping[str, Any], namespace: str | None, name: str, status: kopf.Status, **kwargs: Any
    ) -> None:
        live = count(kwargs[consumed.index], namespace, name)
        if event.get("type") != "DELETED" and status.get("consumers") != live:
            await asyncio.to_thread(write_consumers, consumed.kind, namespace, name, live)

    return repair
