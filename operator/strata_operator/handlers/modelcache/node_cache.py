"""The node cache: what the operator knows about nodes (each a `resources/modelcache/nodes.NodeInfo`), kept
current by a watch instead of a LIST per reconcile.

With hundreds of caches a LIST of every node on every reconcile would dominate the API traffic; one watch
feeds this cache, and only changes that matter to placement (existence, uid, readiness, labels) wake caches.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strata_operator import kube
from strata_operator.resources.modelcache.nodes import NodeInfo


@dataclass(frozen=True)
class NodeChange:
    """`placement`: every node-using cache must look again; `model_labels`: only the caches owning these keys
    (a label of ours edited by someone, or our own write seen on the watch before its answer came back)."""

    placement: bool = False
    model_labels: frozenset[str] = frozenset()


class NodeCache:
    """Thread-safe: the watch writes from kopf's event loop, reconciles read from worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeInfo] = {}
        self._primed = False

    def observe(self, body: Mapping[str, Any], *, deleted: bool = False) -> NodeChange:
        """Record a watch event or our own write's answer; say whom it concerns."""
        info = NodeInfo.from_body(body)
        with self._lock:
            before = self._nodes.get(info.name)
            if deleted:
                self._nodes.pop(info.name, None)
                return NodeChange(placement=before is not None)
            if before is not None and _older(info.resource_version, before.resource_version):
                return NodeChange()  # from before a write of ours that is already recorded
            self._nodes[info.name] = info
        if before is None:
            return NodeChange(placement=True)
        old, new = before.model_labels(), info.model_labels()
        return NodeChange(
            placement=before.placement_key() != info.placement_key(),
            model_labels=frozenset(k for k in old.keys() | new.keys() if old.get(k) != new.get(k)),
        )

    def snapshot(self) -> dict[str, NodeInfo]:
        """All known nodes; the first call LISTs once, so a fresh operator never mistakes 'not yet seen' for
        'gone' (which would drop nodes from status and re-run their preloads)."""
        with self._lock:
            if self._primed:
                return dict(self._nodes)
        listed = kube.list_objects("v1", "Node")
        with self._lock:
            if not self._primed:
                for item in listed:
                    info = NodeInfo.from_body(item)
                    self._nodes.setdefault(info.name, info)
                self._primed = True
            return dict(self._nodes)


def patch_node_label(cache: NodeCache, name: str, key: str, value: str | None) -> None:
    """Merge patch (not server-side apply): apply would drop the labels of other caches we set earlier. The
    answer goes into `cache` at once, so the next plan sees the label without waiting for the watch."""
    patched = kube.merge_patch("v1", "Node", name, None, {"metadata": {"labels": {key: value}}})
    cache.observe(patched.to_dict())


def patch_node_annotation(name: str, key: str, value: str | None) -> None:
    """Merge patch of one annotation (None removes it); the node cache keeps no annotations, nothing to record."""
    kube.merge_patch("v1", "Node", name, None, {"metadata": {"annotations": {key: value}}})


def _older(candidate: str, known: str) -> bool:
    """Whether a node's resourceVersion predates the one we hold. They are etcd revisions: integers that only
    grow for one object; anything else is treated as new, which at worst costs one extra reconcile."""
    try:
        return int(candidate) < int(known)
    except ValueError:
        return False
