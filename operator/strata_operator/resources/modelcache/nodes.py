"""What a ModelCache plan knows of a node: identity, readiness and labels (from the operator's node watch)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strata_operator.resources.core import node_not_ready
from strata_operator.resources.modelcache.names import MODEL_LABEL_PREFIX


@dataclass(frozen=True)
class NodeInfo:
    name: str
    uid: str
    ready: bool
    labels: Mapping[str, str] = field(default_factory=dict)
    resource_version: str = ""
    not_ready: str = ""
    """Why the node is not Ready (`core.node_not_ready`); empty when it is."""

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> NodeInfo:
        meta = body.get("metadata") or {}
        why = node_not_ready(body)
        labels = dict(meta.get("labels") or {})
        resource_version = str(meta.get("resourceVersion", ""))
        return cls(meta["name"], meta.get("uid", ""), why is None, labels, resource_version, why or "")

    def placement_key(self) -> tuple[Any, ...]:
        """What decides where copies go: identity, readiness and labels other than our model labels.
        Heartbeats are left out, so a node's routine status updates wake nobody."""
        labels = tuple(sorted((k, v) for k, v in self.labels.items() if not k.startswith(MODEL_LABEL_PREFIX)))
        return (self.uid, self.ready, labels)

    def model_labels(self) -> dict[str, str]:
        return {k: v for k, v in self.labels.items() if k.startswith(MODEL_LABEL_PREFIX)}

    def matches(self, selector: Mapping[str, str]) -> bool:
        return all(self.labels.get(k) == v for k, v in selector.items())
