"""The reads behind a NodeLocal cache's node budgets (`resources/modelcache/capacity.py` decides with them).

Cheap part, every NodeLocal reconcile: this cache's own consumer pods, per node (its copies' lastUsed) and those
not started yet (an evicted copy they need comes back). The
rest only when a preload Job is about to be created (the plan's `needs_inputs` round): the NodeCachePolicies,
every ModelCache (their status says which copies are Ready where) and every pod that opts into a model cache
(which copies are consumed on which node). A namespaced install cannot list other namespaces: then only the
cache's own namespace is read, and the node's message says so.
"""

from __future__ import annotations

from kubernetes.dynamic.exceptions import ApiException, ResourceNotFoundError

from strata_operator import kube
from strata_operator.api import API_VERSION
from strata_operator.resources.core import MODEL_CACHE_LABEL
from strata_operator.resources.modelcache import capacity, demand
from strata_operator.resources.modelcache.owner import CacheRef

FORBIDDEN = 403


def consumer_pods(owner: CacheRef) -> tuple[dict[str, int], list[demand.WaitingPod]]:
    """This cache's live consumer pods per node (its copies' lastUsed), and those that have not started yet
    (they may need an evicted copy back)."""
    pods = kube.list_objects("v1", "Pod", namespace=owner.namespace, label_selector=f"{MODEL_CACHE_LABEL}={owner.name}")
    found: dict[str, int] = {}
    waiting = []
    for pod in pods:
        if (pending := demand.WaitingPod.from_body(pod)) is not None:
            waiting.append(pending)
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") not in capacity.ENDED_POD_PHASES:
            found[node] = found.get(node, 0) + 1
    return found, waiting


def gather_capacity(owner: CacheRef) -> capacity.CapacityView:
    try:
        bodies = kube.list_objects(API_VERSION, "NodeCachePolicy")
    except ResourceNotFoundError:  # the CRD is not installed: no budgets anywhere
        return capacity.CapacityView()
    policies = [p for p in (capacity.NodePolicy.from_body(b) for b in bodies) if p is not None]
    if not policies:
        return capacity.CapacityView()
    partial = None
    try:
        caches = kube.list_objects(API_VERSION, "ModelCache")
        pods = kube.list_objects("v1", "Pod", label_selector=MODEL_CACHE_LABEL)
    except ApiException as error:
        if error.status != FORBIDDEN:
            raise
        partial = f"only namespace {owner.namespace} is readable by the operator"
        caches = kube.list_objects(API_VERSION, "ModelCache", namespace=owner.namespace)
        pods = kube.list_objects("v1", "Pod", namespace=owner.namespace, label_selector=MODEL_CACHE_LABEL)
    return capacity.CapacityView(policies, capacity.copies_from(caches, pods), partial)
