"""One level-based reconcile of a ModelCache: read what is, create what is missing, write status if it moved.

Safe to run any number of times: children are only written when missing or different, status only when the
rendered status differs from the stored one, and Events only on transitions.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kubernetes.dynamic.exceptions import ApiException
from pydantic import ValidationError

from strata_operator import kube
from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.handlers import modelcache_pernode as pernode
from strata_operator.handlers.modelcache_io import (
    Context,
    api_error_message,
    delete_job,
    get_dict,
    is_subset,
    job_result,
    patch_status,
)
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache import storage
from strata_operator.resources.modelcache.owner import Owner
from strata_operator.resources.modelcache.status import Outcome, Problem, SpecError
from strata_operator.resources.modelcache.volume import build_volume_snippet

CARRIED = ("totalBytes", "totalFiles", "size", "seconds", "resolvedRevision", "manifestSha256", "claimUid")


def reconcile(body: Mapping[str, Any], previous: Mapping[str, Any]) -> tuple[dict[str, Any], list[Any]]:
    """Returns (the status now stored, Events to post). `previous` is the status last seen or written."""
    owner = Owner.from_body(body)
    ctx = None
    try:
        spec = ModelCacheSpec.model_validate(body.get("spec") or {})
    except ValidationError as error:
        outcome = st.blocked_outcome(invalid_spec(error), {})
    else:
        ctx = Context(body, owner, spec, dict(previous))
        try:
            outcome = {
                StorageMode.SHARED_PVC: reconcile_shared_pvc,
                StorageMode.NODE_LOCAL: pernode.reconcile_node_local,
                StorageMode.IMAGE_VOLUME: reconcile_image_volume,
            }[spec.storage.mode](ctx)
        except SpecError as error:  # the builders refuse what the CRD let through: a person must change it
            outcome = st.blocked_outcome(error.problem(), {})
    desired = st.render_status(previous, outcome, owner.generation)
    events = (ctx.events if ctx else []) + st.transition_events(previous, desired)
    patch = st.status_patch(previous, desired)
    if patch is not None:
        patch_status(owner, patch)
    return desired, events


def invalid_spec(error: ValidationError) -> Problem:
    """The model's refusal, one `spec.<field>: <what is wrong>` per error (pydantic's text names no fields)."""
    details = "; ".join(
        f"spec.{'.'.join(str(part) for part in e['loc'])}: {str(e['msg']).removeprefix('Value error, ')}"
        for e in error.errors()
    )
    return Problem("InvalidSpec", f"{details}; fix the spec, the operator retries when it changes")


def ensure_claim(ctx: Context) -> tuple[dict[str, Any] | None, Problem | None]:
    """The claim to fill: an adopted one must exist; ours is created or put back the way we render it."""
    owner, spec = ctx.owner, ctx.spec
    name = storage.claim_name(owner, spec)
    live = get_dict("v1", "PersistentVolumeClaim", name, owner.namespace)
    if storage.claim_is_adopted(spec):
        if live is None:
            return None, Problem(
                "ClaimNotFound",
                f"PersistentVolumeClaim {name!r} (storage.sharedPVC.claimName) does not exist in namespace "
                f"{owner.namespace!r}: create it, or set storage.sharedPVC.size and drop claimName",
            )
        return live, None
    if live is not None and not owner.created(live):
        # Someone else's claim under our default name: forced apply would make the cache its controller, and
        # deleting the cache would then garbage-collect the user's data. Adopting is the user's call.
        return None, Problem(
            "NameConflict",
            f"PersistentVolumeClaim {name!r} already exists in namespace {owner.namespace!r} and was not created "
            f"by this ModelCache: to fill it on purpose set storage.sharedPVC.claimName: {name}; otherwise rename "
            "the cache or delete that claim",
        )
    desired = storage.build_claim(owner, spec)
    if live is not None and claim_matches(desired, live, owner.uid):
        return live, None
    class_name = spec.storage.shared_pvc.storage_class_name if spec.storage.shared_pvc else None
    if live is None and class_name and get_dict("storage.k8s.io/v1", "StorageClass", class_name, None) is None:
        return None, Problem(
            "StorageClassNotFound",
            f"StorageClass {class_name!r} (storage.sharedPVC.storageClassName) does not exist: "
            "use one from `kubectl get storageclass` that offers ReadWriteMany",
        )
    try:
        applied = kube.apply(desired).to_dict()
    except ApiException as error:
        return live, Problem("ClaimRejected", f"claim {name!r}: {api_error_message(error)}")
    ctx.event("Normal", "ClaimCreated" if live is None else "ClaimRestored", f"PersistentVolumeClaim {name}")
    return applied, None


def claim_matches(desired: dict[str, Any], live: dict[str, Any], owner_uid: str) -> bool:
    """Our labels and size are in place, and we own the claim exactly when the deletion policy says Delete."""
    owned = any(ref.get("uid") == owner_uid for ref in live["metadata"].get("ownerReferences") or [])
    return (
        is_subset(desired["metadata"].get("labels"), live["metadata"].get("labels"))
        and is_subset(desired["spec"]["resources"], live["spec"].get("resources"))
        and owned == ("ownerReferences" in desired["metadata"])
    )


def reconcile_shared_pvc(ctx: Context) -> Outcome:
    owner, spec, previous = ctx.owner, ctx.spec, ctx.previous
    fields: dict[str, Any] = {
        "claimName": storage.claim_name(owner, spec),
        "volume": build_volume_snippet(owner, spec),
    }
    claim, problem = ensure_claim(ctx)
    if claim is None or problem is not None:
        return st.blocked_outcome(problem or Problem("ClaimNotFound", "no claim"), fields)
    claim_uid = claim["metadata"]["uid"]
    preload_hash, job = storage.shared_pvc_preload(owner, spec, claim_uid)
    job_name = job["metadata"]["name"]
    fields.update(preloadHash=preload_hash, job=job_name)
    if previous.get("preloadHash") == preload_hash and previous.get("phase") == st.PHASE_READY:
        fields.update({k: previous.get(k) for k in CARRIED})
        return st.ready_outcome(fields, f"claim {fields['claimName']} holds a verified copy of {spec.source.uri}")
    if previous.get("job") and previous["job"] != job_name and delete_job(owner.namespace, previous["job"]):
        ctx.event("Normal", "PreloadSuperseded", f"deleted Job {previous['job']}: the fetch request changed")
    live = get_dict("batch/v1", "Job", job_name, owner.namespace)
    if live is None:
        if problem := ctx.input_problem():
            return st.blocked_outcome(problem, fields)
        try:
            kube.apply(job)
        except ApiException as error:
            return st.blocked_outcome(Problem("JobRejected", f"Job {job_name}: {api_error_message(error)}"), fields)
        ctx.event("Normal", "PreloadStarted", f"Job {job_name} copies {spec.source.uri} into {fields['claimName']}")
        return st.preloading_outcome(fields, f"Job {job_name} created")
    return shared_job_outcome(ctx, live, fields, claim_uid)


def shared_job_outcome(ctx: Context, job: dict[str, Any], fields: dict[str, Any], claim_uid: str) -> Outcome:
    name = job["metadata"]["name"]
    phase = st.job_phase(job)
    if phase == st.JOB_RUNNING:
        return st.preloading_outcome(fields, f"Job {name} is copying {ctx.spec.source.uri}")
    result, error = job_result(ctx, job, succeeded=phase == st.JOB_SUCCEEDED)
    if error is not None or result is None:
        reason = "PreloadFailed" if phase == st.JOB_FAILED else "ResultUnverified"
        message = f"Job {name}: {error}. Fix the source or spec, or delete the Job to retry"
        return st.failed_outcome(fields, reason, message)
    fields.update(st.result_fields(result), claimUid=claim_uid)
    return st.ready_outcome(fields, f"claim {fields['claimName']} holds a verified copy of {ctx.spec.source.uri}")


def reconcile_image_volume(ctx: Context) -> Outcome:
    """Nothing to download: pods mount the image; optional pre-pull Jobs warm the nodes."""
    fields: dict[str, Any] = {"volume": build_volume_snippet(ctx.owner, ctx.spec)}
    reference = storage.image_reference(ctx.spec)
    message = f"pods mount {reference} as an image volume"
    if not storage.image_volume(ctx.spec).pre_pull:
        return Outcome(
            phase=st.PHASE_READY,
            ready=(True, "VolumeAvailable", message),
            progressing=(False, "VolumeAvailable", "nothing to download"),
            fields=fields,
        )
    return pernode.reconcile_prepull(ctx, fields, message)
