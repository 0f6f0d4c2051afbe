"""Test bodies shared by the two clusters that run Strata's pods for real: the local real node
(`realnode/tests`) and kind with a GPU node (`e2e/`). A `Site` says what differs between them — how pods
reach S3, what storage a claim gets, which node to use — and each scenario is written once against it.
"""

from __future__ import annotations

import concurrent.futures
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes.dynamic import DynamicClient
from strata_operator.webhook.wiring import MODEL_READY_GATE

from strata_testsupport.kube import resource, wait_for
from strata_testsupport.pods import (
    API,
    RUNTIME_IMAGE,
    TENSOR_DIGESTS,
    condition,
    kv_client_pod,
    model_cache,
    read_model_in_pod,
    run_pod,
    wait_phase,
)

MANAGED = "app.kubernetes.io/managed-by=strata"
CHILD_KINDS = (
    ("batch/v1", "Job"),
    ("v1", "PersistentVolumeClaim"),
    ("apps/v1", "DaemonSet"),
    ("v1", "Service"),
    ("v1", "ConfigMap"),
    ("v1", "Pod"),
)


@dataclass(frozen=True)
class Site:
    """A cluster with Strata installed, seen from one namespace."""

    client: DynamicClient
    namespace: str
    s3_endpoint: str  # as pods see it
    s3_secret: str  # a Secret in `namespace` with AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY
    # cache name -> the `storage.sharedPVC` block; may prepare storage first (a static PV on the real node)
    shared_pvc: Callable[[str], dict[str, Any]]
    node_selector: dict[str, str] = field(default_factory=dict)
    runtime_image: str = RUNTIME_IMAGE
    region: str = "us-east-1"


def pod_placement(site: Site) -> dict[str, Any]:
    """Where the site's test pods run, and from which image."""
    placement: dict[str, Any] = {"image": site.runtime_image}
    if site.node_selector:
        placement["nodeSelector"] = site.node_selector
    return placement


def shared_cache_from_s3(site: Site, name: str, uri: str) -> None:
    """Create a SharedPVC ModelCache of `uri`, checksums verified; returns at once (the preload has just begun)."""
    spec = {
        "source": {
            "uri": uri,
            "credentials": {"secretRef": {"name": site.s3_secret}},
            "s3": {"endpoint": site.s3_endpoint, "region": site.region},
        },
        "storage": {"mode": "SharedPVC", "sharedPVC": site.shared_pvc(name)},
        "preload": {"verify": "checksums"},
    }
    model_cache(site.client, site.namespace, name, spec)


def preload_from_s3(site: Site, name: str, uri: str, timeout: float = 600) -> dict[str, Any]:
    """A SharedPVC ModelCache of `uri`, checksums verified, waited on until Ready; returns its status."""
    shared_cache_from_s3(site, name, uri)
    status = wait_phase(site.client, site.namespace, name, {"Ready", "Degraded", "Failed"}, timeout=timeout)
    assert status["phase"] == "Ready", status
    assert condition(status, "Ready")["status"] == "True", status
    claim = resource(site.client, "v1", "PersistentVolumeClaim").get(name=status["claimName"], namespace=site.namespace)
    assert claim.status.phase == "Bound", "the claim bound for real"
    return status


def consumer_reads_every_tensor(site: Site, status: dict[str, Any], expected: dict[str, str]) -> None:
    """The consumption contract: a pod that pastes `status.volume` reads each tensor's exact bytes."""
    digests = read_model_in_pod(site.client, site.namespace, "consumer", status["volume"], **pod_placement(site))
    assert digests == expected, "the bytes a consumer reads differ from the source model"


def labelled_pod_reads_every_tensor(
    site: Site, cache: str, expected: dict[str, str], pod: str = "wired", timeout: float = 300
) -> dict[str, Any]:
    """A pod that only names the cache in its label: the admission webhook (served by the operator's pod, called
    by the API server through its Service) adds the volume, the mount and STRATA_MODEL_DIR; the pod reads each
    tensor's exact bytes from there. Returns the pod as stored, to show what was added."""
    out = run_pod(
        site.client,
        site.namespace,
        pod,
        ["python", "-c", TENSOR_DIGESTS, "$(STRATA_MODEL_DIR)"],
        labels={"strata.dev/model-cache": cache},
        timeout=timeout,
        **pod_placement(site),
    )
    assert dict(json.loads(out.strip().splitlines()[-1])) == expected, "a webhook-wired pod read other bytes"
    return dict(resource(site.client, "v1", "Pod").get(name=pod, namespace=site.namespace).to_dict())


def gated_pod_waits_for_the_cache_then_reads(
    site: Site, cache: str, uri: str, expected: dict[str, str], release_storage: Callable[[], None]
) -> None:
    """A labelled pod created while its cache is still preloading is stored with the `strata.dev/model-ready`
    scheduling gate and stays unscheduled (PodScheduled False, SchedulingGated) while the cache is not Ready; the
    operator lifts the gate once it is, and the same pod then schedules, starts and reads every tensor.

    The site's storage for `cache` must stay unavailable until `release_storage()`: the preload cannot finish
    before the test has seen each gate state it judges, however fast the preload or slow the scheduler."""
    pods = resource(site.client, "v1", "Pod")
    shared_cache_from_s3(site, cache, uri)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        reading = pool.submit(labelled_pod_reads_every_tensor, site, cache, expected, "gated", 600)
        stored = wait_for(
            lambda: pods.get(name="gated", namespace=site.namespace).to_dict(), interval=0.2, what="the gated pod"
        )
        gates = [g["name"] for g in stored["spec"].get("schedulingGates") or []]
        assert gates == [MODEL_READY_GATE], f"a pod whose cache is not Ready is created gated: {stored['spec']}"
        held = wait_for(
            lambda: scheduling_gated(pods.get(name="gated", namespace=site.namespace).to_dict()),
            what="the scheduler to say the pod is SchedulingGated",
        )
        assert held["spec"].get("nodeName") is None, "a gated pod is not scheduled"
        wait_for(
            lambda: "WaitingForModelCache" in pod_event_reasons(site, "gated"),
            what="the operator to say on the pod what it waits for",
        )
        assert cache_phase(site, cache) != "Ready", "the cache's storage is held: it cannot be Ready yet"
        release_storage()
        reading.result()
    ready = condition(cache_status_of(site, cache), "Ready")
    scheduled = next(
        c
        for c in pods.get(name="gated", namespace=site.namespace).to_dict()["status"]["conditions"]
        if c["type"] == "PodScheduled"
    )
    assert scheduled["status"] == "True" and scheduled["lastTransitionTime"] >= ready["lastTransitionTime"], (
        f"the pod was scheduled ({scheduled}) only once the cache was Ready ({ready})"
    )
    assert "ModelCacheReady" in pod_event_reasons(site, "gated"), "the operator says it lifted the gate"


def scheduling_gated(pod: dict[str, Any]) -> dict[str, Any] | None:
    """The pod, once its PodScheduled condition says SchedulingGated (the scheduler saw the gate)."""
    conditions = (pod.get("status") or {}).get("conditions") or []
    gated = any(c["type"] == "PodScheduled" and c.get("reason") == "SchedulingGated" for c in conditions)
    return pod if gated else None


def pod_event_reasons(site: Site, pod: str) -> set[str]:
    events = resource(site.client, "v1", "Event").get(
        namespace=site.namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={pod}"
    )
    return {e.reason for e in events.items}


def cache_status_of(site: Site, name: str) -> dict[str, Any]:
    got = resource(site.client, API, "ModelCache").get(name=name, namespace=site.namespace).to_dict()
    return dict(got.get("status") or {})


def cache_phase(site: Site, name: str) -> str | None:
    status = resource(site.client, API, "ModelCache").get(name=name, namespace=site.namespace).to_dict().get("status")
    return (status or {}).get("phase")


def tier_serves_a_pod_on_its_node(site: Site, tier: str, spec: dict[str, Any], count: int = 40) -> dict[str, Any]:
    """A KVCacheTier on the site's node; a client pod with the connection ConfigMap round-trips chunks through
    the node-local Service. Returns the ready server pod."""
    resource(site.client, API, "KVCacheTier").create(
        namespace=site.namespace,
        body={"apiVersion": API, "kind": "KVCacheTier", "metadata": {"name": tier}, "spec": spec},
    )
    server = ready_server(site, tier)
    written = kv_client_pod(site.client, site.namespace, tier, f"{tier}-writer", "write", count, **pod_placement(site))
    assert written["host"] == f"{tier}.{site.namespace}.svc", "clients reach the server by the Service's name"
    read = kv_client_pod(site.client, site.namespace, tier, f"{tier}-reader", "read", count, **pod_placement(site))
    assert all(read[f"chunk-{i:04d}"] for i in range(count)), read
    service = resource(site.client, "v1", "Service").get(name=tier, namespace=site.namespace)
    assert service.spec.internalTrafficPolicy == "Local"
    return server


def server_pods(site: Site, tier: str) -> list[dict[str, Any]]:
    pods = resource(site.client, "v1", "Pod").get(
        namespace=site.namespace, label_selector=f"app.kubernetes.io/instance={tier}"
    )
    return [p for p in pods.to_dict()["items"] if not p["metadata"].get("deletionTimestamp")]


def ready_server(site: Site, tier: str, not_uid: str | None = None, timeout: float = 300) -> dict[str, Any]:
    """The tier's server pod once every container is ready (another one than `not_uid`, after a kill)."""

    def ready() -> dict[str, Any] | None:
        for pod in server_pods(site, tier):
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if pod["metadata"]["uid"] != not_uid and statuses and all(s["ready"] for s in statuses):
                return pod
        return None

    return wait_for(ready, timeout=timeout, interval=1, what=f"a ready server pod of {tier}")


def deleting_leaves_nothing_behind(site: Site, caches: list[str], tiers: list[str], timeout: float = 300) -> None:
    """Delete the resources; finalizers finish, every child goes, and no node keeps a model label."""
    for kind, names in (("ModelCache", caches), ("KVCacheTier", tiers)):
        for name in names:
            resource(site.client, API, kind).delete(name=name, namespace=site.namespace)
    for kind, names in (("ModelCache", caches), ("KVCacheTier", tiers)):
        if names:
            wait_for(
                lambda kind=kind: not resource(site.client, API, kind).get(namespace=site.namespace).items,
                timeout=timeout,
                interval=1,
                what=f"{kind}s deleted (finalizers done)",
            )
    for api_version, kind in CHILD_KINDS:
        wait_for(
            lambda api_version=api_version, kind=kind: (
                not resource(site.client, api_version, kind).get(namespace=site.namespace, label_selector=MANAGED).items
            ),
            timeout=timeout,
            interval=1,
            what=f"every {kind} Strata made to be gone",
        )
    nodes = resource(site.client, "v1", "Node").get().to_dict()["items"]
    labels = [key for node in nodes for key in node["metadata"].get("labels") or {}]
    assert not [key for key in labels if key.startswith("strata.dev/model")], labels
