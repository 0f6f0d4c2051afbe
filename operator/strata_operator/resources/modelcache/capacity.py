"""The node budget's operator side: which policy covers a node path, which copies a node's Job may evict, and what
its result means for the other caches (pure: plain data in, plain data out). The same concept on the node is
`strata_loader.capacity` (the request the Job gets and the report it returns); the reads are
`handlers/modelcache/io.py`.

The split (docs/nodecachepolicy.md): the operator cannot see a node's filesystem, so it
decides *which* copies may go and in what order, and the Job on the node decides *whether* any must go
(`strata_loader.fetch.eviction`). A copy is offered for eviction only when it is another cache's complete (Ready)
copy on that node and the same node path, of the same namespace unless the policy's `evictAcrossNamespaces` allows more,
not in the policy's `pinned` list (nor `storage.nodeLocal.pinned` by a cache of the same namespace), and no live
pod on that node consumes it; least recently used first, by the `lastUsed` its cache keeps in status (the last
time a consumer was seen on the node, or when the copy became Ready). The namespace's byte budget on the node
(the policy's `namespaceBudget`/`namespaceBudgets`) travels with it and the Job enforces it. The budget is computed
when the Job is created and travels in its environment, outside the request hash: another cache being used more
recently never causes a new preload.
"""

from __future__ import annotations

import copy
import datetime
import posixpath
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from strata_loader.capacity import (
    ENV_NODE_CAPACITY,
    EVICTED_ENTRY_OVERHEAD,
    EVICTED_REPORT_BYTES,
    EXIT_INSUFFICIENT_STORAGE,
    MAX_CANDIDATES,
    MAX_PROTECTED,
    CapacityRequest,
)
from strata_loader.contract import FetchResult
from strata_units import ByteSize

from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.api.nodecachepolicy import NodeCachePolicySpec
from strata_operator.resources.core import MODEL_CACHE_LABEL
from strata_operator.resources.modelcache import names
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache.jobs import CONTAINER, NODE_ROOT_MOUNT
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.owner import CacheRef

NODE_LABEL_EVICTED = "Evicted"
"""The value of `strata.dev/model.<key>` on a node whose copy was evicted: pods select `=Ready`, so none is placed
there; the cache keeps the node in status as Evicted until a waiting pod needs the copy there (`demand`) or the
label is removed, and then fetches it again."""

LAST_USED_RESOLUTION = datetime.timedelta(minutes=10)
"""How stale `lastUsed` may get before a consumer seen on the node moves it: finer would rewrite status on every
reconcile of a used cache, for an order that only matters between copies idle for much longer."""

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
ENDED_POD_PHASES = ("Succeeded", "Failed")


@dataclass(frozen=True)
class NodePolicy:
    name: str
    spec: NodeCachePolicySpec

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> NodePolicy | None:
        """None for a policy whose spec this operator cannot read (the CRD refuses such; an older schema might not)."""
        try:
            spec = NodeCachePolicySpec.model_validate(body.get("spec") or {})
        except ValidationError:
            return None
        return cls(str((body.get("metadata") or {}).get("name", "")), spec)


@dataclass(frozen=True)
class CopyOnNode:
    """One cache's complete copy on one node, as its status records it, and whether it may go."""

    namespace: str
    name: str
    node: str
    path: str
    last_used: str
    pinned: bool
    consumers: int

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass
class CapacityView:
    """What the plan needs to give a node's Job its budget (gathered only when a Job is about to be created)."""

    policies: Sequence[NodePolicy] = ()
    copies: Sequence[CopyOnNode] = ()
    partial: str | None = None
    """Why some caches could not be read (e.g. a namespaced install cannot list other namespaces): said in the
    node's message so nobody mistakes the candidate list for complete."""


def _clean(path: str) -> str:
    return posixpath.normpath(path)


def policy_for(policies: Iterable[NodePolicy], node: NodeInfo, path: str) -> NodePolicy | None:
    """The policy covering this node and host path: the first by name among those that match."""
    matching = [p for p in policies if _clean(p.spec.path) == _clean(path) and node.matches(p.spec.node_selector)]
    return min(matching, key=lambda p: p.name) if matching else None


def copies_from(caches: Iterable[Mapping[str, Any]], pods: Iterable[Mapping[str, Any]]) -> list[CopyOnNode]:
    """Every NodeLocal cache's Ready copies, with their consumers per node (live pods that name the cache in
    `strata.dev/model-cache` and are bound to the node; a terminating pod still reads, so it counts)."""
    consumers: dict[tuple[str, str, str], int] = {}
    for pod in pods:
        meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
        cache = (meta.get("labels") or {}).get(MODEL_CACHE_LABEL)
        node = spec.get("nodeName")
        if not cache or not node or (pod.get("status") or {}).get("phase") in ENDED_POD_PHASES:
            continue
        key = (str(meta.get("namespace", "")), cache, node)
        consumers[key] = consumers.get(key, 0) + 1
    found = []
    for body in caches:
        meta = body.get("metadata") or {}
        try:
            spec = ModelCacheSpec.model_validate(body.get("spec") or {})
        except ValidationError:
            continue
        if spec.storage.mode != StorageMode.NODE_LOCAL:
            continue
        local = spec.storage.node_local
        path = local.path if local else "/var/lib/strata/models"
        namespace, name = str(meta.get("namespace", "")), str(meta.get("name", ""))
        for state in (body.get("status") or {}).get("nodes") or []:
            if state.get("phase") != st.PHASE_READY:
                continue
            node = str(state.get("name", ""))
            found.append(
                CopyOnNode(
                    namespace=namespace,
                    name=name,
                    node=node,
                    path=path,
                    last_used=str(state.get("lastUsed") or ""),
                    pinned=bool(local and local.pinned),
                    consumers=consumers.get((namespace, name, node), 0),
                )
            )
    return found


def budget(view: CapacityView, owner: CacheRef, spec: ModelCacheSpec, node: NodeInfo) -> CapacityRequest | None:
    """The budget for this cache's Job on `node`, or None when no policy covers the node and path."""
    local = spec.storage.node_local
    path = local.path if local else "/var/lib/strata/models"
    policy = policy_for(view.policies, node, path)
    if policy is None:
        return None
    own = f"{owner.namespace}/{owner.name}"
    here = [c for c in view.copies if c.node == node.name and _clean(c.path) == _clean(path) and c.key != own]
    offered, kept, elsewhere = [], [], 0
    for c in here:
        why = why_kept(c, owner.namespace, policy)
        if why is None:
            offered.append(c)
        elif c.namespace == owner.namespace:
            kept.append(f"{c.key} ({why})")
        else:
            elsewhere += 1  # other namespaces' cache names are not the tenant's to read in its status
    reasons = sorted(kept)
    if elsewhere:
        rule = "in use or pinned" if policy.spec.evict_across_namespaces else "other namespaces are not evicted"
        reasons.append(f"{elsewhere} copies of other namespaces ({rule}, NodeCachePolicy {policy.name})")
    if view.partial:
        reasons.append(f"caches not seen: {view.partial}")
    return CapacityRequest(
        root=NODE_ROOT_MOUNT,
        policy=policy.name,
        high_watermark=policy.spec.high_watermark,
        low_watermark=policy.spec.low_watermark,
        min_free_bytes=policy.spec.min_free or ByteSize(0),
        candidates=_fitting([c.key for c in sorted(offered, key=lambda c: (c.last_used, c.key))]),
        protected=reasons[:MAX_PROTECTED],
        protected_more=max(0, len(reasons) - MAX_PROTECTED),
        namespace_budget_bytes=policy.spec.budget_of(owner.namespace),
    )


def why_kept(c: CopyOnNode, namespace: str, policy: NodePolicy) -> str | None:
    """Why a cache of `namespace` may not evict copy `c` under `policy`; None when it may.

    The rules are the platform team's (the policy): other namespaces only when it allows, never what it pins;
    a cache's own `pinned` only keeps it from the caches of its own namespace; a copy in use is never evicted."""
    if c.namespace != namespace and not policy.spec.evict_across_namespaces:
        return "another namespace"
    reasons = []
    if policy.spec.pins(c.namespace, c.name):
        reasons.append(f"pinned by NodeCachePolicy {policy.name}")
    elif c.pinned and c.namespace == namespace:
        reasons.append("pinned by its cache")
    if c.consumers:
        reasons.append(f"in use by {c.consumers} pod(s) on this node")
    return ", ".join(reasons) or None


def _fitting(keys: list[str]) -> list[str]:
    """The least recently used first, as many as a Job's report of evicting them all can carry."""
    taken: list[str] = []
    size = 0
    for key in keys[:MAX_CANDIDATES]:
        size += len(key) + EVICTED_ENTRY_OVERHEAD
        if size > EVICTED_REPORT_BYTES:
            break
        taken.append(key)
    return taken


def with_budget(body: Mapping[str, Any], request: CapacityRequest) -> dict[str, Any]:
    """The node's Job carrying its budget (environment) and failing at once, without retries, when the copy
    cannot fit (the loader's exit status for it): a retry would evict nothing new and fail the same way."""
    job: dict[str, Any] = copy.deepcopy(dict(body))
    pod = job["spec"]["template"]["spec"]
    container = next(c for c in pod["containers"] if c["name"] == CONTAINER)
    container["env"] = [
        *(e for e in container.get("env") or [] if e["name"] != ENV_NODE_CAPACITY),
        *({"name": k, "value": v} for k, v in request.to_env().items()),
    ]
    job["spec"]["podFailurePolicy"] = {
        "rules": [
            {
                "action": "FailJob",
                "onExitCodes": {
                    "containerName": CONTAINER,
                    "operator": "In",
                    "values": [EXIT_INSUFFICIENT_STORAGE],
                },
            }
        ]
    }
    return job


def result_fields(result: FetchResult) -> dict[str, Any]:
    """What a node's state records of the Job's capacity report."""
    cap = result.capacity
    if cap is None:
        return {}
    fields: dict[str, Any] = {"usedBytes": cap.used_bytes, "freeBytes": cap.free_bytes, "policy": cap.policy}
    if cap.evicted:
        fields["evicted"] = [e.copy_key for e in cap.evicted]
    return fields


def eviction_labels(node: str, result: FetchResult) -> list[tuple[str, str, str]]:
    """(node, label key, Evicted) for each copy the Job evicted there: the evicted cache sees it and stops
    claiming the node, and no new pod is placed there meanwhile."""
    if result.capacity is None:
        return []
    out = []
    for evicted in result.capacity.evicted:
        namespace, _, name = evicted.copy_key.partition("/")
        out.append((node, names.node_label_key(namespace, name), NODE_LABEL_EVICTED))
    return out


def evicted_state(prev: Mapping[str, Any]) -> dict[str, Any]:
    kept = {k: v for k, v in prev.items() if k in ("name", "job", "policy", "lastUsed")}
    return {
        **kept,
        "phase": st.PHASE_EVICTED,
        "message": "copy evicted to make room for another copy under the node's NodeCachePolicy; it is fetched "
        "again when a pod of this cache waits for a node like this one (or remove the node label); to keep it, "
        "ask the platform team to add it to the policy's pinned list",
    }


def insufficient(result: FetchResult | None) -> bool:
    return result is not None and result.reason == st.PHASE_INSUFFICIENT_STORAGE


def last_used(prev: Mapping[str, Any], state: Mapping[str, Any], consumers: int, now: datetime.datetime) -> str:
    """A Ready copy's `lastUsed`: now when it just became Ready or a consumer is on the node and the recorded
    time is older than the resolution; otherwise what was recorded."""
    recorded = prev.get("lastUsed") if prev.get("job") == state.get("job") else None
    stamp = now.strftime(TIME_FORMAT)
    if not recorded:
        return stamp
    if consumers:
        try:
            then = datetime.datetime.strptime(str(recorded), TIME_FORMAT).replace(tzinfo=datetime.UTC)
        except ValueError:
            return stamp
        if now - then >= LAST_USED_RESOLUTION:
            return stamp
    return str(recorded)
