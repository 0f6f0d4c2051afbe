"""The owning ModelCache as builders need it: identity for ownerReferences and labels, nothing else."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strata_operator import kube
from strata_operator.api import API_VERSION
from strata_operator.resources.modelcache.names import CACHE_LABEL, ROLE_LABEL

KIND = "ModelCache"
COMPONENT = "modelcache"


@dataclass(frozen=True)
class Owner:
    name: str
    namespace: str
    uid: str
    generation: int | None = None

    @classmethod
    def from_body(cls, body: Mapping[str, Any]) -> Owner:
        meta = body["metadata"]
        return cls(meta["name"], meta["namespace"], meta["uid"], meta.get("generation"))

    def reference(self) -> dict[str, Any]:
        return kube.owner_reference(
            {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": self.name, "uid": self.uid}}
        )

    def created(self, live: Mapping[str, Any]) -> bool:
        """Whether this cache made `live` (see `kube.created_by_strata`): only then may it be applied over."""
        return kube.created_by_strata(live, self.uid, self.name, COMPONENT)

    def labels(self, role: str) -> dict[str, str]:
        """Labels on every child: Strata's ownership labels plus the cache name, for watches and listing."""
        return {**kube.child_labels(self.name, COMPONENT), CACHE_LABEL: self.name, ROLE_LABEL: role}
