"""What the operator knows about nodes, kept current by a watch instead of a LIST per reconcile.

With hundreds of caches a LIST of every node on every reconcile would dominate the API traffic; one watch
feeds this cache, and only changes that matter to placement (existence, uid, readiness, labels) wake caches.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strata_operator import kube


@dataclass(frozen=True)
class NodeInfo:
    name: str
    uid: str
    ready: bool
    labels: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> NodeInfo:
        meta = body.get("metadata") or {}
        conditions = (body.get("status") or {}).get("conditions") or []
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)
        return cls(meta["name"], meta.get("uid", ""), ready, dict(meta.get("labels") or {}))

    def placement_key(self) -> tuple[Any, ...]:
        """What decides where copies go and which labels we own. Heartbeats are left out; our own label
        writes are recorded by `set_label` first, so only someone else's edit of them wakes caches."""
        return (self.uid, self.ready, tuple(sorted(self.labels.items())))

    def matches(self, selector: Mapping[str, str]) -> bool:
        return all(self.labels.get(k) == v for k, v in selector.items())


class NodeCache:
    """Thread-safe: the watch writes from kopf's event loop, reconciles read from worker threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nodes: dict[str, NodeInfo] = {}
        self._primed = False

    def observe(self, body: Mapping[str, Any], *, deleted: bool = False) -> bool:
        """Record a watch event; True when placement may have changed."""
        info = NodeInfo.from_body(body)
        with self._lock:
            before = self._nodes.get(info.name)
            if deleted:
                self._nodes.pop(info.name, None)
                return before is not None
            self._nodes[info.name] = info
        return before is None or before.placement_key() != info.placement_key()

    def set_label(self, name: str, key: str, value: str | None) -> None:
        """Reflect our own label write at once, so the next reconcile does not write it again."""
        with self._lock:
            node = self._nodes.get(name)
            if node is None:
                return
            labels = {k: v for k, v in node.labels.items() if k != key}
            if value is not None:
                labels[key] = value
            self._nodes[name] = NodeInfo(node.name, node.uid, node.ready, labels)

    def snapshot(self) -> dict[str, NodeInfo]:
        """All known nodes; the first call LISTs once, so a fresh operator never mistakes 'not yet seen' for
        'gone' (which would drop nodes from status and re-run their preloads)."""
        with self._lock:
            if self._primed:
                return dict(self._nodes)
        listed = kube.dynamic_client().resources.get(api_version="v1", kind="Node").get().to_dict()
        with self._lock:
            if not self._primed:
                for item in listed.get("items") or []:
                    info = NodeInfo.from_body(item)
                    self._nodes.setdefault(info.name, info)
                self._primed = True
            return dict(self._nodes)


NODES = NodeCache()


def patch_node_label(name: str, key: str, value: str | None) -> None:
    """Merge patch (not server-side apply): apply would drop the labels of other caches we set earlier."""
    nodes = kube.dynamic_client().resources.get(api_version="v1", kind="Node")
    nodes.patch(
        name=name,
        body={"metadata": {"labels": {key: value}}},
        content_type="application/merge-patch+json",
    )
    NODES.set_label(name, key, value)
