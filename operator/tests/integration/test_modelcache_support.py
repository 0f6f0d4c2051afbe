"""Helpers (no tests) for the ModelCache integration tests: creating caches, and standing in for the kubelet.

No kubelet runs here, so a preloader pod never executes. kwok moves pods on its fake nodes to Running and
Succeeded, but it cannot write the termination message `strata-loader fetch` leaves; the tests therefore write
the pod's status through the API (the status subresource) with a real `FetchResult` JSON as the message, which
is exactly what the kubelet would report. Between kwok's completion and that write the operator may briefly
report "no termination message" for a node; it re-reads the pod when the message arrives. Everything else (Job
controller, scheduler, garbage collector, CEL validation) is the real thing.
"""

from __future__ import annotations

import datetime
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from strata_loader.contract import FetchResult
from strata_operator.api import API_VERSION
from strata_testsupport.kube import (
    FAKE_NODE_ANNOTATION,
    create_fake_node,
    delete_quietly,
    get_or_none,
    resource,
    wait_for,
)

JOB_NAME_LABEL = "batch.kubernetes.io/job-name"


def cache_body(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "ModelCache", "metadata": {"name": name}, "spec": spec}


def create_cache(k8s: DynamicClient, namespace: str, name: str, spec: dict[str, Any]) -> Any:
    return resource(k8s, API_VERSION, "ModelCache").create(body=cache_body(name, spec), namespace=namespace)


def get_cache(k8s: DynamicClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(resource(k8s, API_VERSION, "ModelCache").get(name=name, namespace=namespace).to_dict())


def condition(cache: dict[str, Any], type_: str) -> dict[str, Any]:
    for c in cache.get("status", {}).get("conditions") or []:
        if c["type"] == type_:
            return dict(c)
    return {}


def wait_for_status(
    k8s: DynamicClient, namespace: str, name: str, predicate: Any, what: str, timeout: float = 45
) -> dict[str, Any]:
    def check() -> dict[str, Any] | None:
        cache = get_cache(k8s, namespace, name)
        return cache if predicate(cache.get("status") or {}) else None

    try:
        return dict(wait_for(check, timeout=timeout, what=what)["status"])
    except AssertionError as error:
        pods = resource(k8s, "v1", "Pod").get(namespace=namespace).to_dict()["items"]
        seen = [(p["metadata"]["name"], p["status"].get("phase"), p["metadata"].get("deletionTimestamp")) for p in pods]
        events = [(e["reason"], e["message"]) for e in resource(k8s, "v1", "Event").get(namespace=namespace).items]
        cache = get_cache(k8s, namespace, name).get("status")
        raise AssertionError(f"{error}\nlast status: {cache}\npods: {seen}\nevents: {events}") from None


def cache_jobs(k8s: DynamicClient, namespace: str, name: str, role: str = "preload") -> list[dict[str, Any]]:
    selector = f"strata.dev/modelcache={name},strata.dev/role={role}"
    found = resource(k8s, "batch/v1", "Job").get(namespace=namespace, label_selector=selector)
    return [dict(j) for j in found.to_dict()["items"]]


def ready_node(k8s: DynamicClient, name: str, labels: dict[str, str] | None = None) -> str:
    """A kwok-managed fake node; where kwok does not run, the test marks it Ready through the API."""
    create_fake_node(k8s, name, labels=labels or {})

    def is_ready() -> bool:
        node = resource(k8s, "v1", "Node").get(name=name).to_dict()
        conditions = node.get("status", {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    try:
        wait_for(is_ready, timeout=10, what=f"kwok to mark {name} Ready")
    except AssertionError:
        now = _now()
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "test stand-in",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        resource(k8s, "v1", "Node").status.patch(
            name=name, body={"status": {"conditions": [ready]}}, content_type="application/strategic-merge-patch+json"
        )
    return name


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job_pod(k8s: DynamicClient, namespace: str, job_name: str) -> dict[str, Any]:
    def find() -> dict[str, Any] | None:
        found = resource(k8s, "v1", "Pod").get(namespace=namespace, label_selector=f"{JOB_NAME_LABEL}={job_name}")
        live = [p for p in found.to_dict()["items"] if not p["metadata"].get("deletionTimestamp")]
        live.sort(key=lambda p: p["metadata"]["creationTimestamp"])
        return dict(live[-1]) if live else None

    return wait_for(find, timeout=30, what=f"a pod of Job {job_name}")


def settled_pod(k8s: DynamicClient, namespace: str, job_name: str, timeout: float = 20) -> dict[str, Any]:
    """The Job's pod once nothing else will write its status: kwok has finished it (pods on kwok nodes run and
    complete, but without a termination message), or it cannot be scheduled (e.g. its claim is unbound).
    Writing earlier would race kwok, whose completion replaces the container statuses."""
    deadline = time.monotonic() + timeout
    while True:
        pod = job_pod(k8s, namespace, job_name)
        status = pod.get("status") or {}
        unschedulable = any(
            c.get("type") == "PodScheduled" and c.get("status") == "False" for c in status.get("conditions") or []
        )
        if status.get("phase") in ("Succeeded", "Failed") or unschedulable or time.monotonic() > deadline:
            return pod
        time.sleep(0.2)


def finish_job(
    k8s: DynamicClient,
    namespace: str,
    job_name: str,
    result: FetchResult | None,
    *,
    succeeded: bool = True,
    exit_code: int | None = None,
) -> None:
    """Report the Job's pod as ended, the way the kubelet does: phase plus the terminated container's message
    (and exit status: the Job controller's podFailurePolicy reads it)."""
    pod = settled_pod(k8s, namespace, job_name)
    now = _now()
    terminated: dict[str, Any] = {
        "exitCode": exit_code if exit_code is not None else (0 if succeeded else 1),
        "reason": "Completed" if succeeded else "Error",
        "startedAt": now,
        "finishedAt": now,
    }
    if result is not None:
        terminated["message"] = result.to_termination_message()
    container = pod["spec"]["containers"][0]
    status = {
        "phase": "Succeeded" if succeeded else "Failed",
        "containerStatuses": [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "started": False,
                "state": {"terminated": terminated},
            }
        ],
    }
    resource(k8s, "v1", "Pod").status.patch(
        name=pod["metadata"]["name"],
        namespace=namespace,
        body={"status": status},
        content_type="application/strategic-merge-patch+json",
    )


def fetch_result(source: str, **extra: Any) -> FetchResult:
    """What a finished fetch reports (a real one always names its manifest's digest: fan-out trusts it)."""
    fields: dict[str, Any] = {"source": source, "bytes": 5 * 2**30, "files": 7, "seconds": 42.0,
                              "manifest_sha256": "sha256:" + "5e" * 32, **extra}  # fmt: skip
    return FetchResult(**fields)


def events_for(k8s: DynamicClient, namespace: str, name: str) -> list[dict[str, Any]]:
    found = resource(k8s, "v1", "Event").get(namespace=namespace, field_selector=f"involvedObject.name={name}")
    return [dict(e) for e in found.to_dict()["items"]]


__all__ = ["get_or_none"]


class Heartbeat:
    """Keeps fake nodes Ready by writing their Ready condition every few seconds, as a kubelet (or kwok) would;
    without it kube-controller-manager marks a silent node NotReady after its grace period."""

    def __init__(self, k8s: DynamicClient, interval: float = 3.0) -> None:
        self.k8s = k8s
        self.interval = interval
        self.nodes: set[str] = set()
        self._beating = threading.Lock()  # held for each beat, so a node silenced gets none after `silence`
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def add(self, name: str, labels: dict[str, str] | None = None) -> str:
        create_fake_node(self.k8s, name, labels=labels or {})
        self.beat(name)
        self.nodes.add(name)
        return name

    def beat(self, name: str) -> None:
        now = _now()
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "KubeletReady",
            "message": "heartbeat written by the test (no kubelet here)",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }
        resource(self.k8s, "v1", "Node").status.patch(
            name=name, body={"status": {"conditions": [ready]}}, content_type="application/strategic-merge-patch+json"
        )

    def remove(self, name: str) -> None:
        with self._beating:
            self.nodes.discard(name)
        delete_quietly(self.k8s, "v1", "Node", name, None)

    def silence(self, name: str) -> None:
        """The node's kubelet goes silent: no beat from here after this returns (one in flight finishes first),
        and kwok stops managing the node (its annotation removed), since kwok stands in for the kubelet too: its
        node-initialize stage writes Ready=True back at once over any Ready condition that is not True."""
        with self._beating:
            self.nodes.discard(name)
        self._kwok(name, None)

    def resume(self, name: str) -> None:
        """The node's kubelet answers again: beats from here and kwok's management, as before `silence`."""
        self._kwok(name, "fake")
        self.beat(name)
        with self._beating:
            self.nodes.add(name)

    def _kwok(self, name: str, value: str | None) -> None:
        body = {"metadata": {"annotations": {FAKE_NODE_ANNOTATION: value}}}
        resource(self.k8s, "v1", "Node").patch(name=name, body=body, content_type="application/merge-patch+json")

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for name in list(self.nodes):
                with self._beating:
                    if name not in self.nodes:  # silenced or removed since the pass began
                        continue
                    try:
                        self.beat(name)
                    except Exception:  # a node deleted under us; the next pass no longer has it
                        self.nodes.discard(name)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for name in list(self.nodes):
            self.remove(name)


class ReconcilePasses:
    """Watches the ModelCache controller's reconcile passes over one cache (the operator runs in this process, so
    the pass is wrapped in place and still does all its work). A pass counts once `visible()` already held when
    it began, e.g. a change the test made is readable; `wait()` returns the Events of the first such pass that
    finished. That is the positive signal a "nothing was written" check needs: the change was read and acted
    on, so what did not change afterwards was really left alone (a sleep would pass without a pass having run).
    """

    def __init__(self, monkeypatch: pytest.MonkeyPatch, namespace: str, name: str, visible: Callable[[], bool]) -> None:
        from strata_operator.handlers.modelcache import events as modelcache

        self._done = threading.Event()
        self.events: list[tuple[str, str, str]] = []
        real = modelcache.reconcile

        def spied(snapshot: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
            meta = snapshot.get("metadata") or {}
            ours = (meta.get("namespace"), meta.get("name")) == (namespace, name) and not self._done.is_set()
            counts = ours and visible()  # read before the pass: everything the pass reads is at least as new
            result = real(snapshot, *args, **kwargs)
            if counts:
                self.events = list(result[1])
                self._done.set()
            return result

        monkeypatch.setattr(modelcache, "reconcile", spied)

    def wait(self, timeout: float = 60) -> list[tuple[str, str, str]]:
        """The first counting pass's Events; the timeout only bounds a hang (the change wakes the daemon)."""
        assert self._done.wait(timeout), f"no reconcile pass began after the change within {timeout:.0f} s"
        return self.events
