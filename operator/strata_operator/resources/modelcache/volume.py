"""The consumption contract: the exact volume and mount a serving pod pastes in, kept in status.volume."""

from __future__ import annotations

from typing import Any

from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.resources.modelcache import names, storage
from strata_operator.resources.modelcache.owner import CacheRef


def volume_name(owner: CacheRef) -> str:
    """The name of the volume in status.volume: pods refuse one that is not a DNS label (a dotted cache name)."""
    return names.dns_label("model", owner.name)


def build_volume_snippet(owner: CacheRef, spec: ModelCacheSpec, pinned: str | None = None) -> dict[str, Any]:
    """`volume` goes in `spec.volumes`, `volumeMount` in the container; NodeLocal adds a `nodeSelector`
    so pods land only where a verified copy is; ImageVolume mounts `pinned` (the resolved digest) and adds
    the pull Secret as `imagePullSecrets`."""
    name = volume_name(owner)
    mode = spec.storage.mode
    if mode == StorageMode.SHARED_PVC:
        source: dict[str, Any] = {
            "persistentVolumeClaim": {"claimName": storage.claim_name(owner, spec), "readOnly": True}
        }
    elif mode == StorageMode.NODE_LOCAL:
        source = {"hostPath": {"path": storage.node_copy_path(owner, spec), "type": "Directory"}}
    else:
        source = storage.image_volume_source(spec, pinned)
    snippet: dict[str, Any] = {
        "volume": {"name": name, **source},
        "volumeMount": {"name": name, "mountPath": spec.mount_path, "readOnly": True},
    }
    if mode == StorageMode.IMAGE_VOLUME and (secrets := storage.image_pull_secrets(spec)):
        snippet["imagePullSecrets"] = secrets
    if mode == StorageMode.NODE_LOCAL:
        snippet["nodeSelector"] = {names.node_label_key(owner.namespace, owner.name): names.NODE_LABEL_READY}
    return snippet
