"""The owning ModelCache as its builders need it: identity for ownerReferences and labels, nothing else."""

from __future__ import annotations

from dataclasses import dataclass

from strata_operator.resources.core import Owner
from strata_operator.resources.modelcache.names import CACHE_LABEL, ROLE_LABEL


@dataclass(frozen=True)
class CacheRef(Owner):
    KIND = "ModelCache"
    COMPONENT = "modelcache"

    def labels(self, role: str) -> dict[str, str]:
        """Labels on every child: Strata's ownership labels plus the cache name and role, for watches and lists."""
        return {**self.ownership_labels(), CACHE_LABEL: self.name, ROLE_LABEL: role}
