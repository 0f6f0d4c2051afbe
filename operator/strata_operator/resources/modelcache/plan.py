"""A ModelCache reconcile's decisions: one pure function from what was observed to what to do.

The controller runs gather → plan → apply → write status if it changed (the same shape as KVCacheTier's):
`handlers/modelcache_io.py` makes every read (`gather`) and fills an `Observed`; `plan` turns it into the objects to
apply, the Jobs to delete, the node labels to set, the status and the Events, without touching the cluster;
`handlers/modelcache_reconcile.py` carries the plan out. So every storage mode's behaviour is a unit test on
plain data (`operator/tests/unit/test_modelcache_plan.py`).

Two facts a plan cannot always have up front, and how it asks for them:
- whether a Job's references (Secret, ServiceAccount, source claim) exist is read only when a Job is about to be
  created; a plan that needs it sets `needs_inputs`, is discarded, and runs again with the answer;
- a SharedPVC preload is named after its claim's uid, so a plan that creates the claim sets `again`: it is
  carried out, and the controller gathers and plans once more in the same reconcile.
An object the API server refuses comes back as `Observed.rejected`, and the plan run again with it says why.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from strata_loader.contract import FetchResult
from strata_units import format_bytes

from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.resources.core import Problem
from strata_operator.resources.modelcache import capacity, demand, fanout, names, storage
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache.jobs import CONTAINER, MODEL_MOUNT, fetch_request, request_hash
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.status import Outcome, SpecError
from strata_operator.resources.modelcache.volume import build_volume_snippet
from strata_operator.resources.runtime_image import RuntimeImage, default_runtime

RECREATE_BASE_SECONDS = 30
RECREATE_MAX_SECONDS = 1800
INSUFFICIENT_RETRY_SECONDS = 300
"""A node whose copy did not fit its budget is tried again after this long (space may have been freed, a cache
unpinned or deleted, a pod ended), with a fresh list of copies it may evict."""
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
CARRIED = ("totalBytes", "totalFiles", "size", "seconds", "resolvedRevision", "manifestSha256", "claimUid")
"""What a settled SharedPVC cache keeps from the result it recorded (its Job may be gone by now)."""

Event = tuple[str, str, str]
"""(type, reason, message) of a Kubernetes Event on the ModelCache."""


@dataclass(frozen=True)
class Action:
    """One write: `apply` an object (server-side), or `delete` one of our Jobs. `event` is posted once the
    write succeeded, so a refused write never claims to have happened."""

    verb: Literal["apply", "delete"]
    body: Mapping[str, Any]
    event: Event | None = None

    @property
    def key(self) -> tuple[str, str]:
        return str(self.body["kind"]), str(self.body["metadata"]["name"])


@dataclass(frozen=True)
class LabelChange:
    """`key=value` on a node; None removes the label."""

    node: str
    key: str
    value: str | None
    foreign: bool = False
    """Another cache's label (an eviction): written without recording the answer, so the node watch sees the
    change and wakes that cache."""


@dataclass
class Observed:
    """Everything a plan may look at, as read by one gather (plain data: tests build it by hand)."""

    owner: CacheRef
    previous: Mapping[str, Any]
    now: datetime.datetime
    spec: ModelCacheSpec | None = None
    spec_problem: Problem | None = None
    """Why the spec cannot be used (the model or a builder refused it); the plan then only reports it."""
    claim: Mapping[str, Any] | None = None
    """SharedPVC: the live claim under the name the cache fills."""
    storage_class_missing: bool = False
    jobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Our live Jobs of the mode's role (preload or prepull), by name."""
    pods: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    """Pods of the ended Jobs whose result is not recorded yet (their termination message is the result)."""
    nodes: Mapping[str, NodeInfo] = field(default_factory=dict)
    inputs_checked: bool = False
    input_problem: Problem | None = None
    """A Job reference that does not exist (only meaningful when `inputs_checked`)."""
    rejected: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(kind, name) → the API server's message, for writes of an earlier plan it refused."""
    runtime: RuntimeImage = field(default_factory=default_runtime)
    """The operator's configured runtime image (from its settings): the Jobs' default image and pull Secrets."""
    capacity: capacity.CapacityView | None = None
    """NodeLocal, read with the Job references (`inputs_checked`): node budgets and the other caches' copies."""
    consumers_on: Mapping[str, int] = field(default_factory=dict)
    """NodeLocal: this cache's live consumer pods per node (for each copy's lastUsed)."""
    waiting: Sequence[demand.WaitingPod] = ()
    """NodeLocal: this cache's consumer pods that have not started (they may need an evicted copy back)."""
    peers: fanout.PeerObjects = field(default_factory=fanout.PeerObjects)
    """NodeLocal: the live peer DaemonSet, Service and NetworkPolicy (see `fanout`)."""


@dataclass
class Plan:
    status: dict[str, Any]
    actions: list[Action] = field(default_factory=list)
    labels: list[LabelChange] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    """Events that follow from the observation itself (transitions, a Job found that status never named)."""
    needs_inputs: bool = False
    again: bool = False
    peer_token_secret: str | None = None
    """A Secret that must exist (created once with a random token) before the actions run."""
    wake_again: bool = False
    """Reconcile once more after this one: fan-out decides from the node states a plan starts with, and this
    plan saw a copy become Ready (the node label it sets wakes nobody: the operator's own write)."""


class _Planner:
    """Collects one plan's writes while the mode functions decide."""

    def __init__(self, observed: Observed) -> None:
        self.observed = observed
        self.actions: list[Action] = []
        self.labels: list[LabelChange] = []
        self.events: list[Event] = []
        self.needs_inputs = False
        self.again = False
        self.node_label: str | None = None
        """NodeLocal: this cache's node label key (its value Evicted marks an evicted copy)."""
        self.build: Callable[[str], Mapping[str, Any]] = lambda node: {}
        """NodeLocal: the preload Job for a node (to start one again after an eviction)."""
        self.needed_again: dict[str, str] = {}
        """NodeLocal: evicted node → the waiting pod its copy is fetched again for (`demand`)."""
        self.peer_token_secret: str | None = None
        self.wake_again = False

    def create(self, body: Mapping[str, Any], event: Event | None) -> str | None:
        """Plan an apply; returns the API server's refusal instead when an earlier plan's apply was refused."""
        action = Action("apply", body, event)
        if refusal := self.observed.rejected.get(action.key):
            return refusal
        self.actions.append(action)
        return None

    def delete_job(self, name: str, event: Event | None = None) -> None:
        body = {"kind": "Job", "metadata": {"name": name, "namespace": self.observed.owner.namespace}}
        self.actions.append(Action("delete", body, event))

    def input_problem(self) -> Problem | None:
        if not self.observed.inputs_checked:
            self.needs_inputs = True
        return self.observed.input_problem


def plan(observed: Observed) -> Plan:
    """What to do about one ModelCache, given what was observed."""
    planner = _Planner(observed)
    spec = observed.spec
    if observed.spec_problem is not None or spec is None:
        outcome = st.blocked_outcome(observed.spec_problem or Problem("InvalidSpec", "no spec"), {})
    else:
        try:
            outcome = MODES[spec.storage.mode](planner, spec)
        except SpecError as error:  # the builders refuse what the CRD let through: a person must change it
            planner = _Planner(observed)
            outcome = st.blocked_outcome(error.problem(), {})
    previous = observed.previous
    desired = st.render_status(previous, outcome, observed.owner.generation, now=observed.now.strftime(TIME_FORMAT))
    return Plan(
        status=desired,
        actions=planner.actions,
        labels=planner.labels,
        events=planner.events + st.transition_events(previous, desired),
        needs_inputs=planner.needs_inputs,
        again=planner.again,
        peer_token_secret=planner.peer_token_secret,
        wake_again=planner.wake_again,
    )


def with_rejections(observed: Observed, rejected: Mapping[tuple[str, str], str]) -> Observed:
    return replace(observed, rejected={**observed.rejected, **rejected})


# -- SharedPVC ---------------------------------------------------------------------------------------------
def _shared_pvc(planner: _Planner, spec: ModelCacheSpec) -> Outcome:
    observed = planner.observed
    owner, previous = observed.owner, observed.previous
    fields: dict[str, Any] = {
        "claimName": storage.claim_name(owner, spec),
        "volume": build_volume_snippet(owner, spec),
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


def _claim(planner: _Planner, spec: ModelCacheSpec) -> tuple[Mapping[str, Any] | None, Problem | None]:
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


def is_subset(desired: Any, live: Any) -> bool:
    """True when every field we render already has that value live (server defaults may add more)."""
    if isinstance(desired, Mapping):
        return isinstance(live, Mapping) and all(is_subset(v, live.get(k)) for k, v in desired.items())
    if isinstance(desired, list):
        return (
            isinstance(live, list)
            and len(desired) == len(live)
            and all(is_subset(d, v) for d, v in zip(desired, live, strict=True))
        )
    return bool(desired == live)


def _shared_job_outcome(
    planner: _Planner, spec: ModelCacheSpec, job: Mapping[str, Any], fields: dict[str, Any], claim_uid: str
) -> Outcome:
    name = job["metadata"]["name"]
    phase = st.job_phase(job)
    if phase == st.JOB_RUNNING:
        return st.preloading_outcome(fields, f"Job {name} is copying {spec.source.uri}")
    result, error = _job_result(planner.observed, spec, job, succeeded=phase == st.JOB_SUCCEEDED)
    if error is not None or result is None:
        reason = "PreloadFailed" if phase == st.JOB_FAILED else "ResultUnverified"
        message = f"Job {name}: {error}. Fix the source or spec, or delete the Job to retry"
        return st.failed_outcome(fields, reason, message)
    fields.update(st.result_fields(result), claimUid=claim_uid)
    return st.ready_outcome(fields, f"claim {fields['claimName']} holds a verified copy of {spec.source.uri}")


def _job_result(
    observed: Observed, spec: ModelCacheSpec, job: Mapping[str, Any], *, succeeded: bool
) -> tuple[FetchResult | None, str | None]:
    """The preloader's FetchResult from its pod's termination message, verified; or why there is none."""
    pods = observed.pods.get(job["metadata"]["name"]) or []
    message = st.termination_message(pods, CONTAINER, succeeded=succeeded)
    if message is None:
        if not succeeded:
            return None, st.job_failure_message(job)
        return None, "succeeded but its pod left no termination message (the preloader's FetchResult JSON)"
    result = FetchResult.from_termination_message(message)
    return result, st.verify_result(result, spec.source.uri, spec.source.revision)


# -- per node: NodeLocal copies and image pre-pulls ---------------------------------------------------------
JobBuilder = Callable[[str, str], tuple[str, dict[str, Any]]]


def _builder(
    build: Callable[..., tuple[str, dict[str, Any]]], owner: CacheRef, spec: ModelCacheSpec, observed: Observed
) -> JobBuilder:
    """One node's Job from a per-node builder, with this cache, spec and configured runtime image."""
    return lambda node, node_uid: build(owner, spec, node, node_uid, observed.runtime)


def selected_nodes(nodes: Mapping[str, NodeInfo], selector: Mapping[str, str]) -> dict[str, NodeInfo]:
    """The Ready nodes the selector picks."""
    return {n: i for n, i in nodes.items() if i.ready and i.matches(selector)}


@dataclass
class NodeStates:
    states: list[dict[str, Any]]
    revisions: dict[str, str | None]
    """Per node with a result read now: the revision the preloader resolved (not part of the node's status)."""


def node_states(planner: _Planner, role: str, wanted: Mapping[str, NodeInfo], build: JobBuilder) -> NodeStates:
    """One state per wanted node: the Job its request names is created where missing, ours not wanted go.

    Level-based: the wanted set is "selected Ready nodes now"; each gets exactly the Job its current request
    hash names, and anything else of ours is deleted.
    """
    observed = planner.observed
    before = {n["name"]: n for n in observed.previous.get("nodes") or []}
    result = NodeStates([], {})
    keep: set[str] = set()
    for name in sorted(wanted):
        _, job = build(name, wanted[name].uid)
        job_name = job["metadata"]["name"]
        keep.add(job_name)
        prev, live = before.get(name) or {}, observed.jobs.get(job_name)
        if evicted := _evicted(planner, name, job_name, prev, live):
            result.states.append(evicted)
            continue
        if prev.get("job") == job_name and prev.get("phase") == st.PHASE_READY:
            result.states.append(_settled(planner, name, prev))  # the Job may be gone (TTL); the result is recorded
            continue
        if live is None:
            result.states.append(_missing_job(planner, name, job, role, prev))
            continue
        if prev.get("job") != job_name:  # created just before a crash: its start was never reported
            planner.events.append(_start_event(role, job_name, name))
        state, fetched = _state_from_job(planner, name, live, read_result=role == storage.ROLE_PRELOAD)
        state = _capacity_outcome(planner, name, prev, state)
        if fetched is not None:
            result.revisions[name] = fetched.revision
        if prev.get("job") == job_name and prev.get("recreations") and state["phase"] != st.PHASE_READY:
            state["recreations"] = prev["recreations"]  # so the next vanishing waits longer
        result.states.append(state)
    for job_name in sorted(observed.jobs.keys() - keep):
        planner.delete_job(job_name)
    return result


def _evicted(
    planner: _Planner, node: str, job_name: str, prev: Mapping[str, Any], live: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """An evicted copy's state: Evicted while the node label says so (another cache's Job removed the copy) and
    no waiting pod needs it; once one does (`demand`), or the label is removed, the old Job goes so the copy is
    fetched again (within the node's budget, like any new copy). None when not evicted."""
    key = planner.node_label
    if key is None or prev.get("job") != job_name:
        return None
    label = planner.observed.nodes[node].labels.get(key)
    if prev.get("phase") == st.PHASE_READY and label == capacity.NODE_LABEL_EVICTED:
        return capacity.evicted_state(prev)
    if prev.get("phase") != st.PHASE_EVICTED:
        return None
    if label == capacity.NODE_LABEL_EVICTED:
        pod = planner.needed_again.get(node)
        if pod is None:
            return dict(prev)
        why = f"pod {pod} is waiting and could run on {node}"
        planner.events.append(("Normal", "CopyNeededAgain", f"fetching the evicted copy on {node} again: {why}"))
    else:
        why = "its node label was removed"
    if live is not None:  # its result describes a copy that is gone: a new Job fetches again
        planner.delete_job(job_name, ("Normal", "PreloadAgain", f"Job {job_name}: fetching the evicted copy again"))
        return {"name": node, "job": job_name, "phase": st.PHASE_PENDING, "message": f"fetching again: {why}"}
    return _start_node_job(planner, node, planner.build(node), storage.ROLE_PRELOAD)


def _needed_again(planner: _Planner, wanted: Mapping[str, NodeInfo]) -> dict[str, str]:
    """The evicted copies waiting pods need back (`demand`), from the node states this plan starts with."""
    before = {str(n.get("name")): n for n in planner.observed.previous.get("nodes") or []}
    gone = (st.PHASE_EVICTED, st.PHASE_FAILED, st.PHASE_INSUFFICIENT_STORAGE)
    evicted = {n: str(s.get("lastUsed") or "") for n, s in before.items() if s.get("phase") == st.PHASE_EVICTED}
    having = {n for n in wanted if (before.get(n) or {}).get("phase") not in gone}
    return demand.needed_again(planner.observed.waiting, wanted, evicted, having)


def _capacity_outcome(planner: _Planner, node: str, prev: Mapping[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """What a node Job's capacity report means beyond its own copy.

    The copies it evicted get their node label set to Evicted (once per result: a label someone removes to
    fetch a copy again is not set back). A copy that did not fit is tried again, with a fresh budget, once
    `INSUFFICIENT_RETRY_SECONDS` passed: the Job is deleted and the usual re-creation creates it anew."""
    same = prev.get("job") == state["job"]
    if state.get("evicted") and not (same and prev.get("evicted") == state["evicted"]):
        for name in state["evicted"]:
            namespace, _, cache = name.partition("/")
            key = names.node_label_key(namespace, cache)
            planner.labels.append(LabelChange(node, key, capacity.NODE_LABEL_EVICTED, foreign=True))
            planner.events.append(("Normal", "CopyEvicted", f"evicted {name} on {node} to make room"))
    if state["phase"] != st.PHASE_INSUFFICIENT_STORAGE:
        return state
    now = planner.observed.now
    if same and prev.get("phase") == st.PHASE_INSUFFICIENT_STORAGE and prev.get("retryAfter"):
        state["retryAfter"] = prev["retryAfter"]
    else:
        when = now + datetime.timedelta(seconds=INSUFFICIENT_RETRY_SECONDS)
        state["retryAfter"] = when.strftime(TIME_FORMAT)
    if now >= _parse_time(state["retryAfter"]):
        planner.delete_job(state["job"])
    return state


def _settled(planner: _Planner, node: str, prev: Mapping[str, Any]) -> dict[str, Any]:
    """A Ready copy as recorded; NodeLocal copies keep their lastUsed current while pods use them."""
    state = dict(prev)
    if planner.node_label is not None:
        consumers = planner.observed.consumers_on.get(node, 0)
        state["lastUsed"] = capacity.last_used(prev, state, consumers, planner.observed.now)
    return state


def _start_event(role: str, job_name: str, node: str) -> Event:
    if role == storage.ROLE_PRELOAD:
        return "Normal", "PreloadStarted", f"Job {job_name} copies the model on {node}"
    return "Normal", "PrePullStarted", f"Job {job_name} pulls the image on {node}"


def _missing_job(
    planner: _Planner, node: str, job: Mapping[str, Any], role: str, prev: Mapping[str, Any]
) -> dict[str, Any]:
    """Create the node's Job, unless it is one we created that vanished before its result was recorded (a TTL
    shorter than our reading, someone deleting it): then back off exponentially, counting in status, instead of
    creating it again at once in a loop."""
    job_name = job["metadata"]["name"]
    ours = prev.get("job") == job_name and prev.get("phase") in (
        st.PHASE_PRELOADING,
        st.PHASE_FAILED,
        st.PHASE_INSUFFICIENT_STORAGE,
    )
    if not ours:
        return _start_node_job(planner, node, job, role)
    now = planner.observed.now
    recreations = int(prev.get("recreations") or 0)
    if retry_after := prev.get("retryAfter"):
        if now < _parse_time(retry_after):
            return dict(prev)
        state = _start_node_job(planner, node, job, role)
        return {**state, "recreations": recreations} if state["phase"] == st.PHASE_PRELOADING else state
    recreations += 1
    delay = min(RECREATE_MAX_SECONDS, RECREATE_BASE_SECONDS * 2 ** (recreations - 1))
    when = now + datetime.timedelta(seconds=delay)
    return {
        "name": node,
        "job": job_name,
        "phase": st.PHASE_PRELOADING,
        "recreations": recreations,
        "retryAfter": when.strftime(TIME_FORMAT),
        "message": f"Job {job_name} vanished before its result was read ({recreations} time(s)); "
        f"creating it again after {delay}s",
    }


def _parse_time(value: str) -> datetime.datetime:
    return datetime.datetime.strptime(value, TIME_FORMAT).replace(tzinfo=datetime.UTC)


def _start_node_job(planner: _Planner, node: str, job: Mapping[str, Any], role: str) -> dict[str, Any]:
    job_name = job["metadata"]["name"]
    state: dict[str, Any] = {"name": node, "job": job_name}
    if problem := planner.input_problem():
        return {**state, "phase": st.PHASE_PENDING, "message": problem.message}
    job, given = _with_budget(planner, node, job)
    if given is not None:
        state["policy"] = given.policy
    if refusal := planner.create(job, _start_event(role, job_name, node)):
        return {**state, "phase": st.PHASE_FAILED, "message": f"Job rejected: {refusal}"}
    return {**state, "phase": st.PHASE_PRELOADING}


def _with_budget(
    planner: _Planner, node: str, job: Mapping[str, Any]
) -> tuple[Mapping[str, Any], capacity.CapacityRequest | None]:
    """NodeLocal: the Job with its node's budget, when a NodeCachePolicy covers the node and path."""
    observed = planner.observed
    view, spec = observed.capacity, observed.spec
    if planner.node_label is None or view is None or spec is None or node not in observed.nodes:
        return job, None
    given = capacity.budget(view, observed.owner, spec, observed.nodes[node])
    return (job, None) if given is None else (capacity.with_budget(job, given), given)


def _state_from_job(
    planner: _Planner, node: str, job: Mapping[str, Any], *, read_result: bool
) -> tuple[dict[str, Any], FetchResult | None]:
    state: dict[str, Any] = {"name": node, "job": job["metadata"]["name"]}
    phase = st.job_phase(job)
    if phase == st.JOB_RUNNING:
        return {**state, "phase": st.PHASE_PRELOADING}, None
    if not read_result:
        if phase == st.JOB_SUCCEEDED:
            return {**state, "phase": st.PHASE_READY, "message": "image pulled"}, None
        return {**state, "phase": st.PHASE_FAILED, "message": st.job_failure_message(job)}, None
    spec = planner.observed.spec
    assert spec is not None  # only planned with a usable spec
    result, error = _job_result(planner.observed, spec, job, succeeded=phase == st.JOB_SUCCEEDED)
    if result is not None:
        state.update(capacity.result_fields(result))
    if error is not None or result is None:
        failed = st.PHASE_INSUFFICIENT_STORAGE if capacity.insufficient(result) else st.PHASE_FAILED
        return {**state, "phase": failed, "message": error or "no result"}, None
    ready = {
        **state,
        "phase": st.PHASE_READY,
        "lastUsed": planner.observed.now.strftime(TIME_FORMAT),
        "bytes": result.bytes,
        "files": result.files,
        "seconds": round(result.seconds, 3),
        "manifestSha256": result.manifest_sha256,  # fan-out: what peers must prove they hold
        "message": f"verified copy: {result.files} files",
    }
    return ready, result


def label_changes(nodes: Mapping[str, NodeInfo], key: str, ready: set[str]) -> list[LabelChange]:
    """`<key>=Ready` exactly on nodes with a verified copy; a change only where that is not so yet."""
    changes = []
    for name, info in sorted(nodes.items()):
        want = name in ready
        if want != (info.labels.get(key) == names.NODE_LABEL_READY):
            changes.append(LabelChange(name, key, names.NODE_LABEL_READY if want else None))
    return changes


def _node_local(planner: _Planner, spec: ModelCacheSpec) -> Outcome:
    observed = planner.observed
    owner = observed.owner
    local = storage.node_local(spec)
    key = names.node_label_key(owner.namespace, owner.name)
    wanted = selected_nodes(observed.nodes, local.node_selector)
    planner.node_label = key
    fan = fanout.decide(
        owner, spec, wanted, observed.previous, observed.jobs, observed.peers, observed.now, observed.runtime, is_subset
    )
    planner.build = lambda node: fan.builder(node, wanted[node].uid)[1]
    planner.needed_again = _needed_again(planner, wanted)
    starting = {n: info for n, info in wanted.items() if n not in fan.waiting}
    found = node_states(planner, storage.ROLE_PRELOAD, starting, fan.builder)
    waiting = [{"name": n, "phase": fanout.NODE_WAITING, "message": m} for n, m in fan.waiting.items()]
    states = sorted(found.states + waiting, key=lambda s: str(s["name"]))
    _fan_out_children(planner, fan)
    before = {n["name"]: n.get("phase") for n in observed.previous.get("nodes") or []}
    if fan.status is not None and any(
        s["phase"] == st.PHASE_READY and before.get(s["name"]) != st.PHASE_READY for s in states
    ):
        planner.wake_again = True
    ready = {s["name"] for s in states if s["phase"] == st.PHASE_READY}
    planner.labels = label_changes(observed.nodes, key, ready) + planner.labels  # + other caches' evictions
    fields = _node_fields(planner, spec, states)
    fields["nodeLabel"] = key
    if fan.status is not None:
        fields["fanOut"] = fan.status
    done = [s for s in states if s["phase"] == st.PHASE_READY and s.get("bytes") is not None]
    if done:
        revisions = list(found.revisions.values())
        fields.update(
            totalBytes=done[0]["bytes"],
            totalFiles=done[0]["files"],
            size=format_bytes(done[0]["bytes"], approximate=True),
            resolvedRevision=revisions[0] if revisions else observed.previous.get("resolvedRevision"),
            # What the spec asked when that commit was resolved: later nodes copy the same commit (fanout).
            resolvedFrom=(spec.source.revision or "") if revisions else observed.previous.get("resolvedFrom"),
        )
    if not wanted:
        message = f"no Ready node matches storage.nodeLocal.nodeSelector {local.node_selector or '{}'}"
        return Outcome(
            st.PHASE_PENDING,
            (False, "NoMatchingNodes", message),
            (False, "NoMatchingNodes", message),
            fields=fields,
        )
    return st.nodes_outcome(
        states,
        ready_reason="AllNodesReady",
        ready_message=f"pods select nodes with {key}=Ready",
        fields=fields,
    )


def _fan_out_children(planner: _Planner, fan: fanout.Decision) -> None:
    """Apply the peer objects that differ; a refusal is told in the fan-out status (the other nodes then wait,
    and read the source after `peerWaitSeconds`)."""
    planner.peer_token_secret = fan.token_secret
    for body in fan.apply:
        if (refusal := planner.create(body, None)) and fan.status is not None:
            fan.status["message"] = f"{body['kind']} {body['metadata']['name']}: {refusal}"


def _node_fields(planner: _Planner, spec: ModelCacheSpec, states: list[dict[str, Any]]) -> dict[str, Any]:
    """Roll-up fields; `preloadHash` fingerprints the fetch request itself (each node's Job adds its node)."""
    return {
        "nodes": states,
        "readyNodes": sum(1 for s in states if s["phase"] == st.PHASE_READY),
        "desiredNodes": len(states),
        "preloadHash": request_hash(spec, fetch_request(spec, MODEL_MOUNT), runtime=planner.observed.runtime),
        "volume": build_volume_snippet(planner.observed.owner, spec),
    }


# -- ImageVolume ---------------------------------------------------------------------------------------------
def _image_volume(planner: _Planner, spec: ModelCacheSpec) -> Outcome:
    """Nothing to download: pods mount the image; optional pre-pull Jobs warm the nodes."""
    owner = planner.observed.owner
    fields: dict[str, Any] = {"volume": build_volume_snippet(owner, spec)}
    message = f"pods mount {storage.image_reference(spec)} as an image volume"
    pull = storage.image_volume(spec)
    if not pull.pre_pull:
        return Outcome(
            phase=st.PHASE_READY,
            ready=(True, "VolumeAvailable", message),
            reconciling=(False, "VolumeAvailable", "nothing to download"),
            fields=fields,
        )
    # The volume works without a pre-pull, so the cache is Ready at once; pulls show as Reconciling.
    wanted = selected_nodes(planner.observed.nodes, pull.node_selector)
    states = node_states(
        planner,
        storage.ROLE_PREPULL,
        wanted,
        _builder(storage.node_prepull, owner, spec, planner.observed),
    ).states
    fields.update(
        nodes=states,
        readyNodes=sum(1 for s in states if s["phase"] == st.PHASE_READY),
        desiredNodes=len(states),
    )
    outcome = st.nodes_outcome(states, ready_reason="VolumeAvailable", ready_message=message, fields=fields)
    outcome.ready = (True, "VolumeAvailable", message)
    outcome.phase = st.PHASE_READY if outcome.phase != st.PHASE_FAILED or not states else st.PHASE_DEGRADED
    return outcome


MODES: dict[StorageMode, Callable[[_Planner, ModelCacheSpec], Outcome]] = {
    StorageMode.SHARED_PVC: _shared_pvc,
    StorageMode.NODE_LOCAL: _node_local,
    StorageMode.IMAGE_VOLUME: _image_volume,
}


def job_role(spec: ModelCacheSpec) -> str | None:
    """The role of the Jobs a mode runs (what gather lists), or None when it runs none."""
    if spec.storage.mode == StorageMode.IMAGE_VOLUME:
        return storage.ROLE_PREPULL if storage.image_volume(spec).pre_pull else None
    return storage.ROLE_PRELOAD


def settled_jobs(previous: Mapping[str, Any]) -> set[str]:
    """Jobs whose verified result status already holds: their pods need not be read again."""
    settled = {s["job"] for s in previous.get("nodes") or [] if s.get("phase") == st.PHASE_READY and s.get("job")}
    if previous.get("phase") == st.PHASE_READY and previous.get("job"):
        settled.add(previous["job"])
    return settled
