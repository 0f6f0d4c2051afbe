"""SharedPVC: one ReadWriteMany claim, filled once by a preload Job and mounted by every pod."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.core import Event, Problem, is_subset, name_conflict
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache import storage
from strata_operator.resources.modelcache.draft import Planner, job_result
from strata_operator.resources.modelcache.status import Outcome
from strata_operator.resources.modelcache.volume import shared_pvc_snippet

CARRIED = ("totalBytes", "totalFiles", "size", "seconds", "resolvedRevision", "manifestSha256", "claimUid")
"""What a settled SharedPVC cache keeps from the result it recorded (its Job may be gone by now)."""


def plan_shared_pvc(planner: Planner, spec: ModelCacheSpec) -> Outcome:
    observed = planner.observed
    owner, previous = observed.owner, observed.previous
    fields: dict[str, Any] = {
        "claimName": storage.claim_name(owner, spec),
        "volume": shared_pvc_snippet(owner, spec),
    }
    claim, problem = _claim(planner, spec)
    if problem is not None:
        return st.blocked_outcome(problem, fields)
    if claim is None:  # being created now: the preload is named after its uid, so plan again once it exists
        planner.again = True
        return st.preloading_outcome(fields, f"creating PersistentVolumeClaim {fields['claimName']}")
    claim_uid = str(claim["metadata"]["uid"])
    preload_hash, job = storage.shared_pvc_preload(owner, spec, claim_uid, observed.runtime)
    job_name = job["metadata"]["name"]
    fields.update(preloadHash=preload_hash, job=job_name)
    if previous.get("preloadHash") == preload_hash and previous.get("phase") == st.PHASE_READY:
        fields.update({k: previous.get(k) for k in CARRIED})
        return st.ready_outcome(fields, f"claim {fields['claimName']} holds a verified copy of {spec.source.uri}")
    for stale in sorted(observed.jobs.keys() - {job_name}):
        planner.delete_job(stale, ("Normal", "PreloadSuperseded", f"deleted Job {stale}: the fetch request changed"))
    started: Event = ("Normal", "PreloadStarted", f"Job {job_name} copies {spec.source.uri} into {fields['claimName']}")
    live = observed.jobs.get(job_name)
    if live is None:
        if problem := planner.input_problem():
            return st.blocked_outcome(problem, fields)
        if refusal := planner.create(job, started):
            return st.blocked_outcome(Problem("JobRejected", f"Job {job_name}: {refusal}"), fields)
        return st.preloading_outcome(fields, f"Job {job_name} created")
    if previous.get("job") != job_name:  # created just before a crash: its start was never reported
        planner.events.append(started)
    return _shared_job_outcome(planner, spec, live, fields, claim_uid)


def _claim(planner: Planner, spec: ModelCacheSpec) -> tuple[Mapping[str, Any] | None, Problem | None]:
    """The claim to fill: an adopted one must exist; ours is created or put back the way we render it.
    (None, None) means it is being created in this plan."""
    observed = planner.observed
    owner, live = observed.owner, observed.claim
    name = storage.claim_name(owner, spec)
    if storage.claim_is_adopted(spec):
        if live is None:
            return None, Problem(
                "ClaimNotFound",
                f"PersistentVolumeClaim {name!r} (storage.sharedPVC.claimName) does not exist in namespace "
                f"{owner.namespace!r}: create it, or set storage.sharedPVC.size and drop claimName",
            )
        return live, None
    # Someone else's claim under our default name: forced apply would make the cache its controller, and deleting
    # the cache would then garbage-collect the user's data. Adopting is the user's call.
    hint = f" (or set storage.sharedPVC.claimName: {name} to fill that claim on purpose)"
    if conflict := name_conflict(owner, "PersistentVolumeClaim", name, live, hint):
        return None, conflict
    desired = storage.build_claim(owner, spec)
    if live is not None and claim_matches(desired, live, owner.uid):
        return live, None
    class_name = spec.storage.shared_pvc.storage_class_name if spec.storage.shared_pvc else None
    if live is None and observed.storage_class_missing:
        return None, Problem(
            "StorageClassNotFound",
            f"StorageClass {class_name!r} (storage.sharedPVC.storageClassName) does not exist: "
            "use one from `kubectl get storageclass` that offers ReadWriteMany",
        )
    verb = "ClaimCreated" if live is None else "ClaimRestored"
    if refusal := planner.create(desired, ("Normal", verb, f"PersistentVolumeClaim {name}")):
        return None, Problem("ClaimRejected", f"claim {name!r}: {refusal}")
    return live, None


def claim_matches(desired: Mapping[str, Any], live: Mapping[str, Any], owner_uid: str) -> bool:
    """Our labels and size are in place, and we own the claim exactly when the deletion policy says Delete."""
    owned = any(ref.get("uid") == owner_uid for ref in live["metadata"].get("ownerReferences") or [])
    return (
        is_subset(desired["metadata"].get("labels"), live["metadata"].get("labels"))
        and is_subset(desired["spec"]["resources"], live["spec"].get("resources"))
        and owned == ("ownerReferences" in desired["metadata"])
    )


def _shared_job_outcome(
    planner: Planner, spec: ModelCacheSpec, job: Mapping[str, Any], fields: dict[str, Any], claim_uid: str
) -> Outcome:
    name = job["metadata"]["name"]
    phase = st.job_phase(job)
    if phase == st.JOB_RUNNING:
        return st.preloading_outcome(fields, f"Job {name} is copying {spec.source.uri}")
    result, error = job_result(planner.observed, spec, job, succeeded=phase == st.JOB_SUCCEEDED)
    if error is not None or result is None:
        reason = "PreloadFailed" if phase == st.JOB_FAILED else "ResultUnverified"
        message = f"Job {name}: {error}. Fix the source or spec, or delete the Job to retry"
        return st.failed_outcome(fields, reason, message)
    fields.update(st.result_fields(result), claimUid=claim_uid)
    return st.ready_outcome(fields, f"claim {fields['claimName']} holds a verified copy of {spec.source.uri}")
