"""Every API read and write of the ModelCache controller: `gather` (what a plan looks at), `execute` (a plan's
writes) and `write_status`; the registry's answer for ImageVolume is `image_lookup`, called from `gather`.

Everything here runs in a worker thread (the kubernetes client blocks); Events are collected and posted by
the caller on kopf's event loop.

NodeLocal's capacity reads (`resources/modelcache/capacity.py` decides with them): every reconcile, this cache's
own consumer pods, per node (its copies' lastUsed) and those not started yet (an evicted copy they need comes
back); only when a preload Job is about to be created (the plan's `needs_inputs` round), the NodeCachePolicies,
every ModelCache (their status says which copies are Ready where) and every pod that opts into a model cache
(which copies are consumed on which node). A namespaced install cannot list other namespaces: then only the
cache's own namespace is read, and the node's message says so.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from typing import Any

from kubernetes.dynamic.exceptions import ApiException, NotFoundError, ResourceNotFoundError
from strata_loader import contract
from strata_loader.contract import CompileCaptureReport
from urllib3.exceptions import HTTPError

from strata_operator import kube
from strata_operator.api import API_VERSION
from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.handlers.common import ensure_token_secret
from strata_operator.handlers.modelcache import image_lookup
from strata_operator.handlers.modelcache.node_cache import NodeCache, patch_node_label
from strata_operator.resources.core import MODEL_CACHE_LABEL, Event, Problem, label_selector, parse_spec
from strata_operator.resources.modelcache import capacity, compile_cache, demand, draft, fanout, image, peers, storage
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache.draft import Plan
from strata_operator.resources.modelcache.names import CACHE_LABEL, ROLE_LABEL
from strata_operator.resources.modelcache.observed import Observed
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.status import SpecError
from strata_operator.resources.runtime_image import RuntimeImage

FORBIDDEN = 403
log = logging.getLogger(__name__)


def gather(
    body: Mapping[str, Any],
    previous: Mapping[str, Any],
    nodes: NodeCache,
    runtime: RuntimeImage,
    *,
    inputs: bool = False,
    now: datetime.datetime | None = None,
    consumers: int | None = None,
    capture_logs: compile_cache.CaptureLogs | None = None,
) -> Observed:
    """Read what the plan for this cache looks at; `inputs`: also check the references a new Job would use.
    `consumers`: the live pods naming the cache (the daemon's pod index), passed through to status.consumers.
    `capture_logs`: the capture sidecars' logs as an earlier gather of this reconcile read them, used instead of
    reading them again (None: read them now)."""
    owner = CacheRef.from_body(body)
    observed = Observed(
        owner=owner,
        previous=dict(previous),
        now=now or datetime.datetime.now(datetime.UTC),
        runtime=runtime,
        consumers=consumers,
    )
    spec, observed.spec_problem = parse_spec(ModelCacheSpec, body)
    if spec is None:
        return observed
    observed.spec = spec
    mode = spec.storage.mode
    try:
        if mode == StorageMode.SHARED_PVC:
            observed.claim = kube.read("v1", "PersistentVolumeClaim", storage.claim_name(owner, spec), owner.namespace)
            class_name = storage.shared_pvc(spec).storage_class_name
            if observed.claim is None and class_name and not storage.claim_is_adopted(spec):
                missing = kube.read("storage.k8s.io/v1", "StorageClass", class_name, None) is None
                observed.storage_class_missing = missing
    except SpecError as error:
        observed.spec_problem = error.problem()
        return observed
    role = draft.job_role(spec)
    if mode != StorageMode.SHARED_PVC:  # ImageVolume without pre-pulls too: its platform, stale labels
        observed.nodes = nodes.snapshot()
    if mode == StorageMode.IMAGE_VOLUME:
        observed.resolve_request = (body.get("metadata", {}).get("annotations") or {}).get(image.RESOLVE_ANNOTATION, "")
        if image.lookup_due(spec, previous, observed.resolve_request, owner.generation, observed.now):
            selector = storage.image_volume(spec).node_selector
            platform = image.lookup_platform(observed.nodes, selector)
            observed.image = image_lookup.look_up(spec, owner.namespace, platform)
    if mode == StorageMode.NODE_LOCAL:
        observed.peers = peer_objects(owner)
    if role is not None:
        observed.jobs = {j["metadata"]["name"]: j for j in list_children(owner, "batch/v1", "Job", role)}
    settled = draft.settled_jobs(previous)
    # A pre-pull's pod is read while its Job runs too: the kubelet's pull error is only in the pod's status.
    ended = (st.JOB_SUCCEEDED, st.JOB_FAILED) if role != storage.ROLE_PREPULL else tuple(st.JOB_PHASES)
    observed.pods = {
        name: job_pods(owner.namespace, name)
        for name, job in observed.jobs.items()
        if name not in settled and st.job_phase(job) in ended
    }
    if mode == StorageMode.NODE_LOCAL or spec.compile_cache.enabled:
        observed.consumer_pods = kube.list_objects(
            "v1", "Pod", namespace=owner.namespace, label_selector=f"{MODEL_CACHE_LABEL}={owner.name}"
        )
    if mode == StorageMode.NODE_LOCAL:
        observed.consumers_on, observed.waiting = consumer_pods(observed.consumer_pods)
    if spec.compile_cache.enabled and capture_logs is not None:
        observed.capture_logs = capture_logs
    elif spec.compile_cache.enabled:
        awaited = compile_cache.pods_to_read(previous, observed.consumer_pods)
        observed.capture_logs = read_capture_logs(owner.namespace, awaited)
    if inputs:
        observed.inputs_checked = True
        observed.input_problem = input_problem(owner, spec)
        if mode == StorageMode.NODE_LOCAL:
            observed.capacity = gather_capacity(owner)
    return observed


CAPTURE_LOG_LINES = 20
CAPTURE_LOG_BYTES = 64 * 1024
"""A capture sidecar prints its report last (and little before it): the tail of its log is enough, and a bound
keeps a noisy one cheap."""


def read_capture_logs(namespace: str, pods: Sequence[str]) -> compile_cache.CaptureLogs:
    """The capture report in each pod's sidecar log, for the pods whose log holds one. A log that cannot be read
    (the kubelet unreachable or too slow, the pod just gone, its sidecar not started) is read again at the next poll,
    and the reconcile goes on; a read the
    API server refuses (no `get pods/log` for the operator here) ends the round, and status says so."""
    found: dict[str, CompileCaptureReport] = {}
    for name in pods:
        try:
            text = kube.pod_log(
                namespace,
                name,
                compile_cache.CAPTURE_CONTAINER,
                tail_lines=CAPTURE_LOG_LINES,
                limit_bytes=CAPTURE_LOG_BYTES,
            )
        except ApiException as error:
            reason = kube.api_error_message(error)
            log.info("compile capture log of pod %s/%s not readable yet: %s", namespace, name, reason)
            if error.status == FORBIDDEN:
                return compile_cache.CaptureLogs(found, asked=True, forbidden=reason)
            continue
        except HTTPError as error:  # the kubelet did not answer within kube.POD_LOG_TIMEOUT_SECONDS, or hung up
            log.info("compile capture log of pod %s/%s not readable yet: %s", namespace, name, error)
            continue
        if (report := CompileCaptureReport.from_log(text)) is not None:
            found[name] = report
    return compile_cache.CaptureLogs(found, asked=bool(pods))


def consumer_pods(pods: Sequence[Mapping[str, Any]]) -> tuple[dict[str, int], list[demand.WaitingPod]]:
    """This cache's live consumer pods per node (its copies' lastUsed), and those that have not started yet
    (they may need an evicted copy back)."""
    found: dict[str, int] = {}
    waiting = []
    for pod in pods:
        if (pending := demand.WaitingPod.from_body(pod)) is not None:
            waiting.append(pending)
        node = (pod.get("spec") or {}).get("nodeName")
        if node and (pod.get("status") or {}).get("phase") not in capacity.ENDED_POD_PHASES:
            found[node] = found.get(node, 0) + 1
    return found, waiting


def gather_capacity(owner: CacheRef) -> capacity.CapacityView:
    try:
        bodies = kube.list_objects(API_VERSION, "NodeCachePolicy")
    except ResourceNotFoundError:  # the CRD is not installed: no budgets anywhere
        return capacity.CapacityView()
    policies = [p for p in (capacity.NodePolicy.from_body(b) for b in bodies) if p is not None]
    if not policies:
        return capacity.CapacityView()
    partial = None
    try:
        caches = kube.list_objects(API_VERSION, "ModelCache")
        pods = kube.list_objects("v1", "Pod", label_selector=MODEL_CACHE_LABEL)
    except ApiException as error:
        if error.status != FORBIDDEN:
            raise
        partial = f"only namespace {owner.namespace} is readable by the operator"
        caches = kube.list_objects(API_VERSION, "ModelCache", namespace=owner.namespace)
        pods = kube.list_objects("v1", "Pod", namespace=owner.namespace, label_selector=MODEL_CACHE_LABEL)
    return capacity.CapacityView(policies, capacity.copies_from(caches, pods), partial)


def peer_objects(owner: CacheRef) -> fanout.PeerObjects:
    """The cache's peer DaemonSet, Service and NetworkPolicy, where they exist and are ours."""
    name = peers.peer_name(owner)

    def ours(api_version: str, kind: str) -> dict[str, Any] | None:
        live = kube.read(api_version, kind, name, owner.namespace)
        return live if live is not None and owner.created(live) else None

    return fanout.PeerObjects(
        daemonset=ours("apps/v1", "DaemonSet"),
        service=ours("v1", "Service"),
        network_policy=ours("networking.k8s.io/v1", "NetworkPolicy"),
    )


def input_problem(owner: CacheRef, spec: ModelCacheSpec) -> Problem | None:
    """References a preloader pod would fail on silently (it would sit in CreateContainerConfigError)."""
    credentials = spec.source.credentials
    ns = owner.namespace
    if credentials and credentials.secret_ref and kube.read("v1", "Secret", credentials.secret_ref.name, ns) is None:
        return Problem(
            "SecretNotFound",
            f"Secret {credentials.secret_ref.name!r} (source.credentials.secretRef) does not exist in "
            f"namespace {ns!r}: create it with the keys the source needs (AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY, or HF_TOKEN), or remove secretRef",
        )
    sa = credentials.service_account_name if credentials else None
    if sa and kube.read("v1", "ServiceAccount", sa, ns) is None:
        return Problem(
            "ServiceAccountNotFound",
            f"ServiceAccount {sa!r} (source.credentials.serviceAccountName) does not exist in namespace {ns!r}",
        )
    if pvc := contract.pvc_source(spec.source.uri):
        claim = pvc[0]
        if kube.read("v1", "PersistentVolumeClaim", claim, ns) is None:
            return Problem(
                "SourceClaimNotFound",
                f"source claim {claim!r} (from {spec.source.uri}) does not exist in namespace {ns!r}",
            )
    return None


def list_children(owner: CacheRef, api_version: str, kind: str, role: str) -> list[dict[str, Any]]:
    selector = label_selector({CACHE_LABEL: owner.name, ROLE_LABEL: role})
    return kube.list_objects(api_version, kind, namespace=owner.namespace, label_selector=selector)


def job_pods(namespace: str, job_name: str) -> list[dict[str, Any]]:
    return kube.list_objects(
        "v1", "Pod", namespace=namespace, label_selector=f"batch.kubernetes.io/job-name={job_name}"
    )


def delete_job(namespace: str, name: str) -> bool:
    """Foreground-free delete that also removes the Job's pods (background propagation)."""
    return kube.delete("batch/v1", "Job", name, namespace)


def execute(plan: Plan, owner: CacheRef, nodes: NodeCache, events: list[Event]) -> dict[tuple[str, str], str]:
    """Carry out a plan's writes in order (the token Secret, the objects, the Jobs to delete, the node labels),
    appending the Event of each one done to `events`; returns what the API server refused, by (kind, name)."""
    rejected: dict[tuple[str, str], str] = {}
    skip: set[tuple[str, str]] = set()
    if plan.token_secret and (conflict := ensure_token_secret(owner, plan.token_secret)[1]):
        peer = peers.peer_name(owner)
        rejected[("DaemonSet", peer)] = conflict.message  # the peers need their token; everything else goes on
        skip = {("DaemonSet", peer), ("Service", peer), ("NetworkPolicy", peer)}
    for action in plan.actions:
        if action.key in skip:
            continue
        if action.verb == "delete":
            if delete_job(owner.namespace, action.key[1]) and action.event:
                events.append(action.event)
            continue
        try:
            kube.apply(action.body)
        except ApiException as error:
            rejected[action.key] = kube.api_error_message(error)
            continue
        if action.event:
            events.append(action.event)
    for change in plan.labels:
        try:
            if change.foreign:  # another cache's label: the node watch sees it and wakes that cache
                kube.merge_patch("v1", "Node", change.node, None, {"metadata": {"labels": {change.key: change.value}}})
                continue
            patch_node_label(nodes, change.node, change.key, change.value)
        except NotFoundError:
            continue
    return rejected


def write_status(owner: CacheRef, patch: Mapping[str, Any]) -> None:
    """The one writer of a cache's status."""
    kube.patch_status(API_VERSION, "ModelCache", owner.name, owner.namespace, patch)
