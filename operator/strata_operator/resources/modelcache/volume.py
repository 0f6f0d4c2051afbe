"""The consumption contract: the exact volume and mount a serving pod pastes in, kept in status.volume; one
builder per storage mode, which that mode's plan calls (the mode is dispatched once, `plan.MODES`)."""

from __future__ import annotations

from typing import Any

from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.modelcache import names, storage
from strata_operator.resources.modelcache.owner import CacheRef


def volume_name(owner: CacheRef) -> str:
    """The name of the volume in status.volume: pods refuse one that is not a DNS label (a dotted cache name)."""
    return names.dns_label("model", owner.name)


def _snippet(owner: CacheRef, spec: ModelCacheSpec, source: dict[str, Any]) -> dict[str, Any]:
    """`volume` goes in `spec.volumes`, `volumeMount` in the container."""
    name = volume_name(owner)
    return {
        "volume": {"name": name, **source},
        "volumeMount": {"name": name, "mountPath": spec.mount_path, "readOnly": True},
    }


def shared_pvc_snippet(owner: CacheRef, spec: ModelCacheSpec) -> dict[str, Any]:
    """The claim the preload filled, read-only."""
    claim = {"claimName": storage.claim_name(owner, spec), "readOnly": True}
    return _snippet(owner, spec, {"persistentVolumeClaim": claim})


def node_local_snippet(owner: CacheRef, spec: ModelCacheSpec) -> dict[str, Any]:
    """The node's copy, and a `nodeSelector` so pods land only where a verified copy is."""
    snippet = _snippet(owner, spec, {"hostPath": {"path": storage.node_copy_path(owner, spec), "type": "Directory"}})
    snippet["nodeSelector"] = {names.node_label_key(owner.namespace, owner.name): names.NODE_LABEL_READY}
    return snippet


def image_volume_snippet(owner: CacheRef, spec: ModelCacheSpec, pinned: str | None = None) -> dict[str, Any]:
    """The image at `pinned` (the resolved digest), and the pull Secret as `imagePullSecrets`."""
    snippet = _snippet(owner, spec, storage.image_volume_source(spec, pinned))
    if secrets := storage.image_pull_secrets(spec):
        snippet["imagePullSecrets"] = secrets
    return snippet
