"""Where a ModelCache's bytes live (claim, node path, image) and the Jobs that fill or empty them."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

from strata_loader import contract

from strata_operator.api.modelcache import (
    DeletionPolicy,
    ImageVolumeStorage,
    ModelCacheSpec,
    NodeLocalStorage,
    SharedPVCStorage,
)
from strata_operator.resources.core import stable_hash
from strata_operator.resources.modelcache import names
from strata_operator.resources.modelcache.jobs import (
    MODEL_MOUNT,
    NODE_ROOT_MOUNT,
    JobShape,
    PodMounts,
    build_job,
    fetch_request,
    request_hash,
    source_mounts,
)
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.status import SpecError
from strata_operator.resources.runtime_image import RuntimeImage, default_runtime

ROLE_PRELOAD = "preload"
ROLE_PREPULL = "prepull"
ROLE_CLEANUP = "cleanup"


def shared_pvc(spec: ModelCacheSpec) -> SharedPVCStorage:
    if spec.storage.shared_pvc is None:  # the CRD's CEL rules make this unreachable for stored objects
        raise SpecError("storage.sharedPVC", "storage.mode SharedPVC needs storage.sharedPVC with size or claimName")
    return spec.storage.shared_pvc


def node_local(spec: ModelCacheSpec) -> NodeLocalStorage:
    return spec.storage.node_local or NodeLocalStorage()


def image_volume(spec: ModelCacheSpec) -> ImageVolumeStorage:
    return spec.storage.image_volume or ImageVolumeStorage()


def claim_name(owner: CacheRef, spec: ModelCacheSpec) -> str:
    return shared_pvc(spec).claim_name or names.claim_name(owner.name)


def claim_is_adopted(spec: ModelCacheSpec) -> bool:
    """A claim named in the spec belongs to the user: filled, never created, resized or deleted."""
    return shared_pvc(spec).claim_name is not None


def build_claim(owner: CacheRef, spec: ModelCacheSpec) -> dict[str, Any]:
    """The RWX claim the operator creates; owned by the cache only when the deletion policy is Delete."""
    storage = shared_pvc(spec)
    if storage.size is None:
        raise SpecError("storage.sharedPVC.size", "is needed to create a claim (or name one in claimName)")
    metadata: dict[str, Any] = {
        "name": claim_name(owner, spec),
        "namespace": owner.namespace,
        "labels": owner.labels("model"),
    }
    if spec.deletion_policy == DeletionPolicy.DELETE:
        metadata["ownerReferences"] = [owner.reference()]
    claim_spec: dict[str, Any] = {
        "accessModes": [storage.access_mode],
        "volumeMode": "Filesystem",
        "resources": {"requests": {"storage": storage.size.spelling}},
    }
    if storage.storage_class_name is not None:
        claim_spec["storageClassName"] = storage.storage_class_name
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": metadata, "spec": claim_spec}


def shared_pvc_preload(
    owner: CacheRef, spec: ModelCacheSpec, claim_uid: str, runtime: RuntimeImage | None = None
) -> tuple[str, dict[str, Any]]:
    """(hash, Job) filling the claim. The claim's uid is part of the hash: a re-created claim is empty."""
    request = fetch_request(spec, MODEL_MOUNT)
    claim = claim_name(owner, spec)
    runtime = runtime or default_runtime()
    preload_hash = request_hash(spec, request, claim, claim_uid, runtime=runtime)
    mounts = source_mounts(spec)
    mounts.add("model", {"persistentVolumeClaim": {"claimName": claim}}, MODEL_MOUNT)
    shape = JobShape(
        name=names.preload_job_name(owner.name, preload_hash),
        role=ROLE_PRELOAD,
        command=list(contract.COMMAND),
        args=request.to_args(),
        mounts=mounts,
        preload_hash=preload_hash,
    )
    return preload_hash, build_job(owner, spec, shape, request, runtime=runtime)


def node_copy_path(owner: CacheRef, spec: ModelCacheSpec) -> str:
    """The copy's directory on the node: one per namespace and name, under the configured root."""
    return posixpath.join(node_local(spec).path, owner.namespace, owner.name)


def _node_root_mounts(spec: ModelCacheSpec, base: PodMounts | None = None) -> PodMounts:
    mounts = base or PodMounts()
    # The root must exist (type Directory): kubelet would create a missing one owned by root, unwritable here.
    mounts.add("node-root", {"hostPath": {"path": node_local(spec).path, "type": "Directory"}}, NODE_ROOT_MOUNT)
    return mounts


def node_preload(
    owner: CacheRef,
    spec: ModelCacheSpec,
    node: str,
    node_uid: str,
    runtime: RuntimeImage | None = None,
    *,
    adjust: Callable[[contract.FetchRequest, PodMounts], contract.FetchRequest] | None = None,
) -> tuple[str, dict[str, Any]]:
    """(hash, Job) copying the model onto one node. The node's uid is in the hash: a new node is empty.
    `adjust` changes the request and adds mounts (fan-out: read from peers, or seed them); it is hashed too."""
    dest = posixpath.join(NODE_ROOT_MOUNT, owner.namespace, owner.name)
    request = fetch_request(spec, dest)
    mounts = _node_root_mounts(spec, source_mounts(spec))
    if adjust is not None:
        request = adjust(request, mounts)
    runtime = runtime or default_runtime()
    node_hash = request_hash(spec, request, node, node_uid, runtime=runtime)
    shape = JobShape(
        name=names.node_job_name(owner.name, ROLE_PRELOAD, node_hash),
        role=ROLE_PRELOAD,
        command=list(contract.COMMAND),
        args=request.to_args(),
        mounts=mounts,
        preload_hash=node_hash,
        node=node,
        tolerations=tuple(node_local(spec).tolerations),
    )
    return node_hash, build_job(owner, spec, shape, request, runtime=runtime)


def node_cleanup_job_name(owner: CacheRef, node: str) -> str:
    return names.node_job_name(owner.name, ROLE_CLEANUP, stable_hash(["cleanup", owner.uid, node]))


def node_cleanup(
    owner: CacheRef, spec: ModelCacheSpec, node: str, runtime: RuntimeImage | None = None
) -> dict[str, Any]:
    """A Job removing the node's copy after the cache is deleted (a shell `rm`: the runtime image has one)."""
    target = posixpath.join(NODE_ROOT_MOUNT, owner.namespace, owner.name)
    node_hash = stable_hash(["cleanup", owner.uid, node])
    shape = JobShape(
        name=node_cleanup_job_name(owner, node),
        role=ROLE_CLEANUP,
        command=["/bin/sh", "-c"],
        args=[f"rm -rf -- '{target}'"],
        mounts=_node_root_mounts(spec),
        preload_hash=node_hash,
        node=node,
        tolerations=tuple(node_local(spec).tolerations),
    )
    job = build_job(owner, spec, shape, runtime=runtime or default_runtime())
    # Owned by the cache, the Job would be garbage-collected with it; it must outlive the cache a little.
    del job["metadata"]["ownerReferences"]
    job["spec"]["ttlSecondsAfterFinished"] = 600
    return job


def image_reference(spec: ModelCacheSpec) -> str:
    """The reference the spec names, without the scheme (a tag, or already a digest): what is looked up in the
    registry; what nodes pull is the pinned one in status.image."""
    return spec.source.uri.removeprefix("oci://")


def image_volume_source(spec: ModelCacheSpec, pinned: str | None = None) -> dict[str, Any]:
    """The image volume of `pinned` (registry/repository@sha256:..., the resolved digest), or of the spec's
    reference before it is resolved."""
    return {"image": {"reference": pinned or image_reference(spec), "pullPolicy": image_volume(spec).pull_policy.value}}


def image_pull_secrets(spec: ModelCacheSpec) -> list[dict[str, str]]:
    """`imagePullSecrets` for a pod mounting the image: the cache's pull Secret, if any."""
    ref = image_volume(spec).pull_secret_ref
    return [{"name": ref.name}] if ref is not None else []


def node_prepull(
    owner: CacheRef,
    spec: ModelCacheSpec,
    node: str,
    node_uid: str,
    runtime: RuntimeImage | None = None,
    *,
    pinned: str | None = None,
) -> tuple[str, dict[str, Any]]:
    """(hash, Job) whose pod mounts the image volume on one node: the kubelet pulls it to start the pod. The
    pinned reference is in the hash: a new resolution pulls again."""
    source = image_volume_source(spec, pinned)
    secrets = image_pull_secrets(spec)
    node_hash = stable_hash(["prepull", source, secrets, node, node_uid])
    mounts = PodMounts()
    mounts.add("model", source, MODEL_MOUNT, read_only=True)
    shape = JobShape(
        name=names.node_job_name(owner.name, ROLE_PREPULL, node_hash),
        role=ROLE_PREPULL,
        command=["/bin/sh", "-c"],
        args=[f"test -d '{MODEL_MOUNT}'"],
        mounts=mounts,
        preload_hash=node_hash,
        node=node,
        tolerations=tuple(image_volume(spec).tolerations),
    )
    job = build_job(owner, spec, shape, runtime=runtime or default_runtime())
    if secrets:
        pod = job["spec"]["template"]["spec"]
        pod["imagePullSecrets"] = [*pod.get("imagePullSecrets", []), *secrets]
    return node_hash, job
