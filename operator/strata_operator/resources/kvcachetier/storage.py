"""The ReadWriteMany claim for `l2.fs.pvc.create`: one filesystem every node's server shares."""

from __future__ import annotations

from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.names import TierRef


def build_pvc(spec: KVCacheTierSpec, tier: TierRef) -> dict[str, Any] | None:
    """The claim to create, or None when the spec names an existing claim, a hostPath or no filesystem."""
    fs = spec.l2.fs if spec.l2 else None
    if fs is None or fs.pvc is None or fs.pvc.create is None:
        return None
    claim_spec: dict[str, Any] = {
        "accessModes": ["ReadWriteMany"],
        "resources": {"requests": {"storage": fs.pvc.create.size.spelling}},
    }
    if fs.pvc.create.storage_class_name is not None:
        claim_spec["storageClassName"] = fs.pvc.create.storage_class_name
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": tier.metadata(tier.created_pvc),
        "spec": claim_spec,
    }


def l2_claim_name(spec: KVCacheTierSpec, tier: TierRef) -> str | None:
    """The claim the servers mount (existing or created), if any."""
    fs = spec.l2.fs if spec.l2 else None
    if fs is None or fs.pvc is None:
        return None
    return fs.pvc.claim_name or tier.created_pvc


def l2_kinds(spec: KVCacheTierSpec) -> str:
    """`fs`, `s3`, `fs,s3` or `none`: what `kubectl get kvt` prints."""
    kinds = []
    if spec.l2 and spec.l2.fs:
        kinds.append("fs")
    if spec.l2 and spec.l2.s3:
        kinds.append("s3")
    return ",".join(kinds) or "none"
