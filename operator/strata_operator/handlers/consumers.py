"""`status.consumers`: how many live pods name each ModelCache and KVCacheTier in their opt-in label.

Two kopf indexes hold the labelled pods that have not ended, keyed by (namespace, name of the cache or tier). A
pod event recounts its one cache or tier; an event of the cache or tier itself repairs a count that is missing
or stale (a new object, or a status rewrite that dropped the field). A write happens only when the stored count
differs.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import kopf
from kubernetes.dynamic.exceptions import NotFoundError

from strata_operator import kube
from strata_operator.api import API_VERSION, GROUP, VERSION
from strata_operator.resources.serving import KV_TIER_LABEL, MODEL_CACHE_LABEL

ENDED = ("Succeeded", "Failed")


def _live(status: Mapping[str, Any], meta: Mapping[str, Any]) -> bool:
    return status.get("phase") not in ENDED and not meta.get("deletionTimestamp")


@kopf.index("", "v1", "pods", labels={MODEL_CACHE_LABEL: kopf.PRESENT})
def model_cache_consumers(
    namespace: str | None, name: str, labels: Mapping[str, str], status: kopf.Status, meta: kopf.Meta, **_: Any
) -> dict[tuple[str, str], str] | None:
    return {(namespace or "", labels[MODEL_CACHE_LABEL]): name} if _live(status, meta) else None


@kopf.index("", "v1", "pods", labels={KV_TIER_LABEL: kopf.PRESENT})
def kv_tier_consumers(
    namespace: str | None, name: str, labels: Mapping[str, str], status: kopf.Status, meta: kopf.Meta, **_: Any
) -> dict[tuple[str, str], str] | None:
    return {(namespace or "", labels[KV_TIER_LABEL]): name} if _live(status, meta) else None


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


@kopf.on.event("", "v1", "pods", labels={MODEL_CACHE_LABEL: kopf.PRESENT})
async def recount_model_cache(namespace: str | None, labels: Mapping[str, str], **kwargs: Any) -> None:
    cache = labels[MODEL_CACHE_LABEL]
    consumers = count(kwargs["model_cache_consumers"], namespace, cache)
    await asyncio.to_thread(write_consumers, "ModelCache", namespace, cache, consumers)


@kopf.on.event("", "v1", "pods", labels={KV_TIER_LABEL: kopf.PRESENT})
async def recount_kv_tier(namespace: str | None, labels: Mapping[str, str], **kwargs: Any) -> None:
    tier = labels[KV_TIER_LABEL]
    consumers = count(kwargs["kv_tier_consumers"], namespace, tier)
    await asyncio.to_thread(write_consumers, "KVCacheTier", namespace, tier, consumers)


@kopf.on.event(GROUP, VERSION, "modelcaches")
async def model_cache_count_repaired(
    event: Mapping[str, Any],
    namespace: str | None,
    name: str,
    status: kopf.Status,
    **kwargs: Any,
) -> None:
    consumers = count(kwargs["model_cache_consumers"], namespace, name)
    if event.get("type") != "DELETED" and status.get("consumers") != consumers:
        await asyncio.to_thread(write_consumers, "ModelCache", namespace, name, consumers)


@kopf.on.event(GROUP, VERSION, "kvcachetiers")
async def kv_tier_count_repaired(
    event: Mapping[str, Any],
    namespace: str | None,
    name: str,
    status: kopf.Status,
    **kwargs: Any,
) -> None:
    consumers = count(kwargs["kv_tier_consumers"], namespace, name)
    if event.get("type") != "DELETED" and status.get("consumers") != consumers:
        await asyncio.to_thread(write_consumers, "KVCacheTier", namespace, name, consumers)
