"""What the builders of every kind share: the owner type, Strata's ownership labels, label selectors, one
stable hash. Pure (no client, no environment), like everything under `resources/`."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Self

from strata_operator.api import API_VERSION, GROUP

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY = "strata"
MODEL_CACHE_LABEL = f"{GROUP}/model-cache"
"""On a serving pod: the ModelCache it uses (the webhook mounts it; `status.consumers` counts it)."""
KV_TIER_LABEL = f"{GROUP}/kv-cache-tier"
"""On a serving pod: the KVCacheTier it uses."""


@dataclass(frozen=True)
class Owner:
    """A Strata custom resource as its children need it: enough to name, label and own them.

    Each kind subclasses it with its `KIND` and `COMPONENT` (and the names of its own children); the
    ownerReference, the ownership labels and the "did we create this?" test are the same for every kind.
    """

    KIND: ClassVar[str] = ""
    COMPONENT: ClassVar[str] = ""

    name: str
    namespace: str
    uid: str
    generation: int | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Self:
        meta = body["metadata"]
        return cls(meta["name"], meta["namespace"], meta.get("uid", ""), meta.get("generation"))

    def reference(self) -> dict[str, Any]:
        """A controller ownerReference, so kube-controller-manager's garbage collector removes the child."""
        return {
            "apiVersion": API_VERSION,
            "kind": self.KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }

    def ownership_labels(self) -> dict[str, str]:
        """Strata's managed-by, instance and component labels, on every child."""
        return child_labels(self.name, self.COMPONENT)

    def created(self, live: Mapping[str, Any]) -> bool:
        """Whether this owner made `live`: only then may Strata apply over it (see `created_by_strata`)."""
        return created_by_strata(live, self.uid, self.name, self.COMPONENT)


@dataclass(frozen=True)
class Problem:
    """Why a resource cannot go on as written: `reason` is a condition reason (CamelCase), `message` says what to
    change. Every kind reports its problems with this one type."""

    reason: str
    message: str


def child_labels(owner_name: str, component: str | None = None) -> dict[str, str]:
    labels = {MANAGED_BY_LABEL: MANAGED_BY, INSTANCE_LABEL: owner_name}
    if component:
        labels[COMPONENT_LABEL] = component
    return labels


def created_by_strata(live: Mapping[str, Any], owner_uid: str, owner_name: str, component: str) -> bool:
    """Whether Strata made this object for that owner: its ownerReference (the owner's uid), or, for a child
    kept without one (a claim under deletionPolicy Retain), Strata's managed-by, instance and component labels.

    Anything else of the same name belongs to someone else: applying over it (forced) would take it over, and the
    garbage collector would later delete it with the owner.
    """
    meta = live.get("metadata") or {}
    if any(ref.get("uid") == owner_uid for ref in meta.get("ownerReferences") or []):
        return True
    labels = meta.get("labels") or {}
    return (
        labels.get(MANAGED_BY_LABEL) == MANAGED_BY
        and labels.get(INSTANCE_LABEL) == owner_name
        and labels.get(COMPONENT_LABEL) == component
    )


def label_selector(labels: Mapping[str, str]) -> str | None:
    """`k=v,k2=v2` (sorted, so the same labels give the same string); None for no labels (select all)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or None


def stable_hash(value: Any, *, length: int = 10) -> str:
    """A hex digest of JSON-able data that never depends on dict order (keys sorted) or on the process: names,
    labels and annotations built from it stay the same across operator restarts and versions."""
    data = json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(data.encode()).hexdigest()[:length]
