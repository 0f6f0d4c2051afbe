"""What Flux and Argo CD conclude about a ModelCache or KVCacheTier in each situation, asked of the tools' own
rules: kstatus (the Go library Flux judges health with, run by hack/kstatus) and the Argo CD health check in
charts/strata/README.md (run as Lua). The statuses come from the operator's own builders (`plan`,
`compute_status`) on observations like the other unit tests', never written by hand. One table,
`strata_testsupport.gitops.VERDICTS`, says what both tools must conclude (the integration tier reads some of its
situations back from the API server); `conditions.py` (GitOps verdicts) says why.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import pytest
from strata_loader.contract import FetchResult
from strata_operator.conditions import get_condition
from strata_operator.resources.core import Problem
from strata_operator.resources.kvcachetier.observed import Observed as TierObserved
from strata_operator.resources.kvcachetier.status import STARTUP_GRACE_SECONDS, Checked, compute_status
from strata_operator.resources.modelcache import capacity, storage
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.plan import plan
from strata_testsupport.gitops import VERDICTS, ArgoHealth, KStatus, custom_resource

from . import test_modelcache_image_plan as image
from .test_kvcachetier_checks import T0, TIER, pod, spec_of, status_of
from .test_modelcache_node_loss import B_DOWN, JOB_A, JOB_B, KEY, UP, WHY, ready_state
from .test_modelcache_plan import (
    EACH_FROM_SOURCE,
    NODE_LOCAL,
    NODES,
    OWNER,
    SHARED,
    SOURCE,
    ended,
    node_job,
    observe,
    our_claim,
    pod_with_result,
)
from .test_modelcache_plan import spec_of as cache_spec_of

# -- ModelCache: statuses from `plan` ------------------------------------------------------------------------


def holding(status: Mapping[str, Any], **conditions: tuple[str, str]) -> Mapping[str, Any]:
    """`status`, once its conditions say (status, reason) as given: the situation is the one its name says, not
    another that happens to get the same verdict."""
    found = {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}
    assert {t: found.get(t) for t in conditions} == conditions
    return status


def cache(status: Mapping[str, Any], *, generation: int = OWNER.generation, deleting: bool = False) -> dict[str, Any]:
    return custom_resource("ModelCache", status, generation=generation, deleting=deleting)


def shared_job() -> tuple[str, dict[str, Any]]:
    _, job = storage.shared_pvc_preload(OWNER, SHARED, "claim-uid")
    return job["metadata"]["name"], job


def shared_preloading() -> Mapping[str, Any]:
    name, job = shared_job()
    return plan(observe(SHARED, claim=our_claim(), jobs={name: job}, previous={"job": name})).status


def shared_ready() -> Mapping[str, Any]:
    name, job = shared_job()
    copied = FetchResult(source=SOURCE, revision="abc", bytes=2048, files=3, seconds=1.5)
    jobs, pods = {name: ended(job, succeeded=True)}, {name: [pod_with_result(copied)]}
    return plan(observe(SHARED, claim=our_claim(), jobs=jobs, pods=pods, previous={"job": name})).status


def shared_new_revision() -> Mapping[str, Any]:
    spec = cache_spec_of({"mode": "SharedPVC", "sharedPVC": {"size": "10Gi"}}, revision="v2")
    ready = holding(shared_ready(), Ready=("True", "Preloaded"))
    result = plan(observe(spec, claim=our_claim(), previous=ready, inputs_checked=True))
    return holding(result.status, Ready=("False", "Preloading"), Reconciling=("True", "Preloading"))


def shared_failed() -> Mapping[str, Any]:
    name, job = shared_job()
    broken = FetchResult(status="Failed", error="403 Forbidden on s3://models/llama", source=SOURCE)
    jobs, pods = {name: ended(job, succeeded=False)}, {name: [pod_with_result(broken, phase="Failed")]}
    return plan(observe(SHARED, claim=our_claim(), jobs=jobs, pods=pods, previous={"job": name})).status


def shared_blocked() -> Mapping[str, Any]:
    problem = Problem("SecretNotFound", "Secret 's3' (source.credentials.secretRef) does not exist")
    return plan(observe(SHARED, claim=our_claim(), inputs_checked=True, input_problem=problem)).status


def node_copy_failed() -> Mapping[str, Any]:
    job_b = node_job("gpu-b", EACH_FROM_SOURCE)
    broken = FetchResult(status="Failed", error="no space left on device", source=SOURCE)
    previous = {"nodes": [ready_state("gpu-a", JOB_A), {"name": "gpu-b", "job": JOB_B, "phase": "Preloading"}]}
    jobs, pods = {JOB_B: ended(job_b, succeeded=False)}, {JOB_B: [pod_with_result(broken, phase="Failed")]}
    status = plan(observe(EACH_FROM_SOURCE, nodes=UP, previous=previous, jobs=jobs, pods=pods)).status
    return holding(status, Ready=("False", "NodePreloadFailed"), Degraded=("True", "NodePreloadFailed"))


def node_lost() -> Mapping[str, Any]:
    previous = {"nodes": [ready_state("gpu-a", JOB_A), ready_state("gpu-b", JOB_B)]}
    status = plan(observe(EACH_FROM_SOURCE, nodes=B_DOWN, previous=previous, inputs_checked=True)).status
    return holding(status, Ready=("True", "AllNodesReady"), Degraded=("True", "NodeNotReady"))


def every_node_lost() -> Mapping[str, Any]:
    all_down = {n: NodeInfo(n, i.uid, False, i.labels, not_ready=WHY) for n, i in UP.items()}
    previous = {"nodes": [ready_state("gpu-a", JOB_A), ready_state("gpu-b", JOB_B)]}
    return plan(observe(EACH_FROM_SOURCE, nodes=all_down, previous=previous)).status


def no_matching_node() -> Mapping[str, Any]:
    return plan(observe(NODE_LOCAL, nodes={"cpu-a": NODES["cpu-a"]})).status


def every_copy_evicted() -> Mapping[str, Any]:
    """Another cache's Jobs evicted both copies: their node labels say Evicted."""
    evicted = {n: NodeInfo(n, i.uid, True, {**i.labels, KEY: capacity.NODE_LABEL_EVICTED}) for n, i in UP.items()}
    previous = {"nodes": [ready_state("gpu-a", JOB_A), ready_state("gpu-b", JOB_B)]}
    return holding(
        plan(observe(EACH_FROM_SOURCE, nodes=evicted, previous=previous)).status, Degraded=("True", "Evicted")
    )


def image_pre_pulling() -> Mapping[str, Any]:
    spec = image.prepull_spec()
    status = plan(image.observe(spec, nodes=image.NODES, image=image.resolved(), inputs_checked=True)).status
    return holding(status, Ready=("True", "VolumeAvailable"), Reconciling=("True", "Preloading"))


def image_pre_pull_failed() -> Mapping[str, Any]:
    """gpu-a's kubelet cannot pull the image; gpu-b pulled it."""
    spec = image.prepull_spec()
    first = plan(image.observe(spec, nodes=image.NODES, image=image.resolved(), inputs_checked=True))
    a, b = sorted(action.body["metadata"]["name"] for action in first.actions)
    bodies = {action.body["metadata"]["name"]: action.body for action in first.actions}
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    jobs = {a: image.running(bodies[a]), b: {**bodies[b], **done}}
    pods = {a: [image.pulling_pod("ErrImagePull", "403 Forbidden")], b: []}
    status = plan(image.observe(spec, nodes=image.NODES, previous=first.status, jobs=jobs, pods=pods)).status
    return holding(status, Ready=("True", "VolumeAvailable"), Degraded=("True", "PrePullFailed"))


def image_denied() -> Mapping[str, Any]:
    denied = image.failed("Denied", "the registry refused the credentials (401)")
    return plan(image.observe(image.image_spec(), nodes=image.NODES, image=denied)).status


def image_unreachable() -> Mapping[str, Any]:
    unreachable = image.failed("Unreachable", "connection refused", transient=True)
    return plan(image.observe(image.image_spec(), nodes=image.NODES, image=unreachable)).status


def image_unreachable_waiting() -> Mapping[str, Any]:
    """Between attempts: nothing was looked up this time, the failure in force is the stored one."""
    status = plan(image.observe(image.image_spec(), nodes=image.NODES, previous=image_unreachable())).status
    return holding(status, Degraded=("True", "RegistryUnreachable"))


def image_tag_gone() -> Mapping[str, Any]:
    """Asked to resolve again (the annotation), the registry no longer has the tag; pods keep the pinned digest."""
    pinned = plan(image.observe(image.image_spec(), nodes=image.NODES, image=image.resolved())).status
    gone = image.failed("NotFound", "404 MANIFEST_UNKNOWN")
    status = plan(
        image.observe(image.image_spec(), nodes=image.NODES, previous=pinned, resolve_request="again", image=gone)
    ).status
    return holding(status, Ready=("True", "VolumeAvailable"), Degraded=("True", "ImageNotFound"))


# -- KVCacheTier: statuses from `compute_status` ---------------------------------------------------------------


def tier(status: Mapping[str, Any], *, generation: int = TIER.generation, deleting: bool = False) -> dict[str, Any]:
    return custom_resource("KVCacheTier", status, generation=generation, deleting=deleting)


def daemonset(desired: int, ready: int, *, updated: int | None = None, settled: bool = True) -> dict[str, Any]:
    """A whole DaemonSet as its controller reports it: what the tier's status reads, and what kstatus reads of a
    DaemonSet (the counters it needs for its own rules too)."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "kv", "namespace": "serving", "generation": 4},
        "status": {
            "observedGeneration": 4 if settled else 3,
            "desiredNumberScheduled": desired,
            "currentNumberScheduled": desired,
            "updatedNumberScheduled": desired if updated is None else updated,
            "numberReady": ready,
            "numberAvailable": ready,
        },
    }


SERVERS = [pod("kv-a", "n1", True), pod("kv-b", "n2", True, "10.0.0.2")]
TIER_DAEMONSETS: dict[str, dict[str, Any]] = {
    "KVCacheTier starting": daemonset(2, 0, settled=False),
    "KVCacheTier rolling out a new configuration (old servers serve: Available)": daemonset(2, 2, updated=1),
    "KVCacheTier all servers ready": daemonset(2, 2),
    "KVCacheTier a server's node lost": daemonset(2, 1),
}
"""The tier situations that follow from what its DaemonSet reports (kstatus judges that DaemonSet the same way)."""


def tier_from(situation: str) -> Mapping[str, Any]:
    return status_of(spec_of(), TIER_DAEMONSETS[situation], SERVERS, config_hash="abc")


def tier_node_lost() -> Mapping[str, Any]:
    servers = [pod("kv-a", "n1", True), pod("kv-b", "n2", False, None)]
    why = "NodeStatusUnknown: Kubelet stopped posting node status."
    lost = TIER_DAEMONSETS["KVCacheTier a server's node lost"]
    observed = TierObserved(TIER, now=T0, daemonset=lost, pods=servers, not_ready_nodes={"n2": why})
    status = compute_status(spec_of(), observed, Checked(config_hash="abc"))
    return holding(status, Available=("True", "InstancesServing"), AllInstancesReady=("False", "NodeNotReady"))


def tier_never_ready() -> Mapping[str, Any]:
    """No server became ready in longer than the startup grace (an image that cannot be pulled, say)."""
    starting = status_of(spec_of(), daemonset(2, 0), now=T0)
    later = f"2026-01-01T00:{STARTUP_GRACE_SECONDS // 60 + 1:02d}:00Z"
    status = status_of(spec_of(), daemonset(2, 0), previous=starting, now=later)
    return holding(status, Available=("False", "NoReadyInstances"))


def tier_invalid() -> Mapping[str, Any]:
    return status_of(spec_of(), problems=[Problem("SecretNotFound", "Secret 'kv-auth' does not exist")])


def tier_no_matching_node() -> Mapping[str, Any]:
    return status_of(spec_of(), daemonset(0, 0))


SITUATIONS: dict[str, Callable[[], dict[str, Any]]] = {
    "ModelCache created, no status yet": lambda: custom_resource("ModelCache", None, generation=1),
    "ModelCache preloading": lambda: cache(shared_preloading()),
    "ModelCache Ready": lambda: cache(shared_ready()),
    "ModelCache preloading a new revision (SharedPVC: the copy is replaced, not Ready meanwhile)": lambda: cache(
        shared_new_revision()
    ),
    "ModelCache preload failed": lambda: cache(shared_failed()),
    "ModelCache spec it cannot act on (a Secret missing)": lambda: cache(shared_blocked()),
    "ModelCache NodeLocal: one node's copy failed, another's Ready": lambda: cache(node_copy_failed()),
    "ModelCache NodeLocal: a node lost, its copy Ready on another (usable, Degraded)": lambda: cache(node_lost()),
    "ModelCache NodeLocal: every node lost": lambda: cache(every_node_lost()),
    "ModelCache NodeLocal: no node matches yet": lambda: cache(no_matching_node()),
    "ModelCache NodeLocal: every copy evicted": lambda: cache(every_copy_evicted()),
    "ModelCache ImageVolume: pods mount it while pre-pulls run (Ready and Reconciling)": lambda: cache(
        image_pre_pulling()
    ),
    "ModelCache ImageVolume: a pre-pull failed on a node, the volume works (usable, Degraded)": lambda: cache(
        image_pre_pull_failed()
    ),
    "ModelCache ImageVolume: the registry refuses the tag": lambda: cache(image_denied()),
    "ModelCache ImageVolume: the registry is unreachable, retrying": lambda: cache(image_unreachable()),
    "ModelCache ImageVolume: the registry is unreachable, waiting for the next attempt": lambda: cache(
        image_unreachable_waiting()
    ),
    "ModelCache ImageVolume: the tag is gone on re-resolution, the earlier digest serves (usable, Degraded)": lambda: (
        cache(image_tag_gone())
    ),
    "ModelCache spec change not observed yet": lambda: cache(shared_ready(), generation=OWNER.generation + 1),
    "ModelCache being deleted": lambda: cache(shared_ready(), deleting=True),
    "KVCacheTier created, no status yet": lambda: custom_resource("KVCacheTier", None, generation=1),
    "KVCacheTier starting": lambda: tier(tier_from("KVCacheTier starting")),
    "KVCacheTier rolling out a new configuration (old servers serve: Available)": lambda: tier(
        tier_from("KVCacheTier rolling out a new configuration (old servers serve: Available)")
    ),
    "KVCacheTier all servers ready": lambda: tier(tier_from("KVCacheTier all servers ready")),
    "KVCacheTier a server's node lost": lambda: tier(tier_node_lost()),
    "KVCacheTier servers not ready past the startup grace": lambda: tier(tier_never_ready()),
    "KVCacheTier configuration invalid": lambda: tier(tier_invalid()),
    "KVCacheTier no node matches": lambda: tier(tier_no_matching_node()),
    "KVCacheTier spec change not observed yet": lambda: tier(
        tier_from("KVCacheTier all servers ready"), generation=TIER.generation + 1
    ),
    "KVCacheTier being deleted": lambda: tier(tier_from("KVCacheTier all servers ready"), deleting=True),
}


def test_the_table_names_every_situation_once() -> None:
    assert list(SITUATIONS) == list(VERDICTS)


@pytest.mark.parametrize("situation", list(VERDICTS))
def test_flux_and_argo_cd_say_what_the_table_says(situation: str, kstatus: KStatus, argo_health: ArgoHealth) -> None:
    obj = SITUATIONS[situation]()
    flux, argo, shown = VERDICTS[situation]
    found_flux, found_argo = kstatus.verdict(obj), argo_health(obj)
    assert (found_flux.status, found_argo.status) == (flux, argo), (
        f"{situation}: kstatus {found_flux}, Argo CD {found_argo}; conditions {obj.get('status', {}).get('conditions')}"
    )
    if shown is not None:  # both read the same condition, so both tell the user the same thing
        condition = get_condition(obj["status"]["conditions"], shown)
        assert condition is not None and condition["message"]
        assert found_flux.message == found_argo.message == condition["message"]


@pytest.mark.parametrize("situation", list(VERDICTS))
def test_reconciling_and_stalled_are_never_both_true(situation: str) -> None:
    """kstatus takes whichever of the two comes first in the list: with both True, its verdict would hang on
    the order the conditions were first written in."""
    conditions = SITUATIONS[situation]().get("status", {}).get("conditions") or []
    both = [c["type"] for c in conditions if c["type"] in ("Reconciling", "Stalled") and c["status"] == "True"]
    assert len(both) <= 1, f"{situation}: {both}"


@pytest.mark.parametrize("situation", list(TIER_DAEMONSETS))
def test_a_tier_reads_as_its_daemonset_does(situation: str, kstatus: KStatus) -> None:
    """A server down with its node, or a rollout under way, is what kstatus already calls InProgress for the
    DaemonSet itself: the tier above it says no less and no more."""
    found = kstatus.verdicts([TIER_DAEMONSETS[situation], SITUATIONS[situation]()])
    assert found[0].status == found[1].status == VERDICTS[situation][0]
