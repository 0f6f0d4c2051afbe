"""The compile cache through the real API server: spec.compileCache refused where it has no store (CEL), a vLLM
pod admitted wired under `restricted` Pod Security (the capture sidecar a native sidecar), and the restore's
termination message, written into the pod's status as the kubelet would, counted into status.compileCache with an
Event for the new key."""

from __future__ import annotations

import contextlib
import copy
import threading
from collections.abc import Iterator
from typing import Any

import kubernetes
import pytest
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import DynamicApiError
from strata_loader.contract import CompileRestoreReport
from strata_operator import kube
from strata_operator.api import API_VERSION
from strata_operator.handlers.modelcache import io
from strata_operator.resources.modelcache import compile_cache as cc
from strata_operator.webhook.compile_cache import CAPTURE_CONTAINER, KEY_CONTAINER, RESTORE_CONTAINER
from strata_testsupport.apirequests import Recorder
from strata_testsupport.kube import printed_row, resource, service_account_may, wait_for
from strata_testsupport.webhook import RunningWebhook

from .test_modelcache_support import create_cache, events_for, get_cache, unique, wait_for_status
from .test_modelcache_validation import message_of
from .test_serving_webhook import create_pod, pod_body, ready_shared_cache

pytestmark = pytest.mark.integration
SOURCE = "s3://models/llama-3-8b"
KEY = "c0" * 32
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "runAsNonRoot": True,
    "seccompProfile": {"type": "RuntimeDefault"},
}
REFUSED: list[tuple[str, dict[str, Any], str]] = [
    (
        "image-volume",
        {"source": {"uri": "oci://registry.example/models/llama:1"}, "storage": {"mode": "ImageVolume"}},
        "compileCache.enabled is not supported with storage.mode ImageVolume: an image volume is read-only",
    ),
    (
        "read-only-claim",
        {
            "source": {"uri": SOURCE},
            "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi", "accessMode": "ReadOnlyMany"}},
        },
        "storage.sharedPVC.accessMode ReadOnlyMany cannot hold a captured compile cache",
    ),
]


@pytest.mark.parametrize(("case", "spec", "expected"), REFUSED, ids=[c[0] for c in REFUSED])
def test_a_compile_cache_without_a_writable_store_is_refused(
    k8s: DynamicClient, strata_crds: Any, namespace: str, case: str, spec: dict[str, Any], expected: str
) -> None:
    with pytest.raises(DynamicApiError) as refused:
        create_cache(k8s, namespace, unique(case), {**spec, "compileCache": {"enabled": True}})
    assert expected in message_of(refused.value)
    create_cache(k8s, namespace, unique(case), spec)  # the same without the compile cache is fine


def test_the_api_server_fills_the_compile_cache_defaults(k8s: DynamicClient, strata_crds: Any, namespace: str) -> None:
    name = unique("defaults")
    create_cache(k8s, namespace, name, {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal"}})
    assert get_cache(k8s, namespace, name)["spec"]["compileCache"] == {"enabled": False, "maxBytes": "20Gi"}
    with pytest.raises(DynamicApiError) as refused:
        spec = {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal"}, "compileCache": {"maxBytes": "1.5Gi"}}
        create_cache(k8s, namespace, unique("fraction"), spec)
    assert "compileCache.maxBytes" in message_of(refused.value)


def report_restore(
    k8s: DynamicClient, namespace: str, pod: str, report: CompileRestoreReport, *, capture_running: bool = False
) -> None:
    """The restore init container ended with its report, written into the pod's status as the kubelet does;
    `capture_running`: and the capture sidecar started after it."""
    terminated = {"exitCode": 0, "reason": "Completed", "message": report.to_termination_message()}
    statuses = [
        {
            "name": RESTORE_CONTAINER,
            "image": "vllm/vllm-openai:latest",
            "imageID": "",
            "ready": False,
            "restartCount": 0,
            "state": {"terminated": terminated},
        }
    ]
    if capture_running:
        running = {"startedAt": "2025-12-06T00:00:00Z"}
        statuses.append(
            {
                "name": CAPTURE_CONTAINER,
                "image": "strata-runtime:test",
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {"running": running},
            }
        )
    status = {"phase": "Running", "initContainerStatuses": statuses}
    resource(k8s, "v1", "Pod").status.patch(
        name=pod, namespace=namespace, body={"status": status}, content_type="application/strategic-merge-patch+json"
    )


def test_a_vllm_pod_is_wired_to_the_compile_cache_and_its_restore_is_counted(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    cache = ready_shared_cache(k8s, namespace, compileCache={"enabled": True, "maxBytes": "2Gi"})
    patch = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    resource(k8s, "v1", "Namespace").patch(body=patch, name=namespace, content_type="application/merge-patch+json")
    labels = {"strata.dev/model-cache": cache}
    body = pod_body("engine", labels, command=["vllm", "serve"], securityContext=RESTRICTED)
    stored = create_pod(k8s, namespace, body)
    init = {c["name"]: c for c in stored["spec"]["initContainers"]}
    names = [c["name"] for c in stored["spec"]["initContainers"]]
    assert names[-3:] == [KEY_CONTAINER, RESTORE_CONTAINER, CAPTURE_CONTAINER]
    assert init[CAPTURE_CONTAINER]["restartPolicy"] == "Always"  # a native sidecar, kept by the API server
    assert "--max-bytes" in init[CAPTURE_CONTAINER]["command"] and str(2 * 2**30) in init[CAPTURE_CONTAINER]["command"]
    volumes = {v["name"]: v for v in stored["spec"]["volumes"]}
    assert volumes["strata-compile-store"]["persistentVolumeClaim"] == {"claimName": f"{cache}-model"}
    (vllm,) = stored["spec"]["containers"]
    assert {"name": "VLLM_USE_AOT_COMPILE", "value": "0"} in vllm["env"]
    assert "strata-compile-store" not in {m["name"] for m in vllm["volumeMounts"]}

    again = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "again", "labels": labels}}
    second = create_pod(k8s, namespace, again | {"spec": copy.deepcopy(stored["spec"])}, dry_run="All")
    assert second["spec"]["initContainers"] == stored["spec"]["initContainers"]

    restored = CompileRestoreReport(
        event="restored",
        key=KEY,
        summary="vllm 0.33.0, torch 2.14.0, cuda:sm_90",
        generation="gen-1764979200000000000-0123abcd",
        files=12,
        bytes=3 * 2**20,
    )
    report_restore(k8s, namespace, "engine", restored)
    status = wait_for_status(
        k8s, namespace, cache, lambda s: (s.get("compileCache") or {}).get("hits") == 1, "one compile cache hit"
    )
    compile_cache = status["compileCache"]
    assert compile_cache["store"] == f"claim {cache}-model, .strata-compile-cache/"
    assert [(c["key"], c["size"], c["captured"]) for c in compile_cache["caches"]] == [
        (KEY, "3.0MiB", "2025-12-06T00:00:00Z")
    ]

    def captured() -> list[dict[str, Any]] | None:
        found = [e for e in events_for(k8s, namespace, cache) if e["reason"] == "CompileCacheCaptured"]
        return found or None

    (event,) = wait_for(captured, timeout=30, what="the CompileCacheCaptured Event")
    assert printed_row(k8s, API_VERSION, "modelcaches", namespace, cache)["Compile Cache"] == "1 key, 1 hit, 0 misses"
    assert KEY[:12] in event["message"] and "pod engine started from it" in event["message"]


def test_an_engine_that_missed_awaits_its_capture_and_the_sidecars_log_is_asked_for(
    k8s: DynamicClient, operator: Any, operator_api_requests: Recorder, namespace: str, pod_webhook: RunningWebhook
) -> None:
    """A miss whose capture sidecar runs is an awaited capture (status.compileCache.capturing), and the operator
    asks the API server for the sidecar's log: the only place its result is while the engine serves. Here no
    kubelet serves logs (the API server refuses: the pod has no node), which the reconcile survives, still
    awaiting; the real node reads a real sidecar's log (bench/realnode_compile.py)."""
    cache = ready_shared_cache(k8s, namespace, compileCache={"enabled": True})
    labels = {"strata.dev/model-cache": cache}
    create_pod(k8s, namespace, pod_body("missed", labels, command=["vllm", "serve"], securityContext=RESTRICTED))
    missed = CompileRestoreReport(event="miss", key=KEY, reason=f"holds no compile cache yet for key {KEY[:12]}")
    report_restore(k8s, namespace, "missed", missed, capture_running=True)
    status = wait_for_status(
        k8s,
        namespace,
        cache,
        lambda s: (s.get("compileCache") or {}).get("capturing") == 1,
        "an awaited capture",
    )
    assert status["compileCache"]["misses"] == 1 and status["compileCache"]["caches"] == []
    assert "captureFailures" not in status["compileCache"]

    def log_asked() -> list[Any] | None:
        made = operator_api_requests.made("get", "pods", subresource="log")
        return [r for r in made if (r.namespace, r.name) == (namespace, "missed")] or None

    wait_for(log_asked, timeout=30, what="the operator's read of the capture sidecar's log")


LOG_READER = "no-pod-logs"
"""A service account the test's log reads impersonate: bound to no role at first, like an operator installed with
a chart older than `pods/log` or a Role of the user's own."""


@contextlib.contextmanager
def operator_reads_as(monkeypatch: pytest.MonkeyPatch, client: DynamicClient) -> Iterator[None]:
    """The operator's API calls made from this thread go through `client`; the session's operator, running in its
    own threads, keeps its admin client (a grant taken away from it would touch every other test)."""
    shared, here = kube.dynamic_client, threading.get_ident()
    with monkeypatch.context() as patched:
        patched.setattr(kube, "dynamic_client", lambda: client if threading.get_ident() == here else shared())
        yield


def test_capture_logs_the_api_server_refuses_are_reported_once_and_read_again_once_granted(
    k8s: DynamicClient, control_plane: Any, namespace: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real API server's RBAC refuses the log read (403): the round ends, status.compileCache says what to
    grant with one Warning, the capture stays awaited and the plan stops polling every 10 s. Once a Role grants
    `get pods/log`, the next read is allowed (the API server then answers 400: no kubelet runs this pod) and the
    report goes away. Only `io.read_capture_logs` reads as the limited account; the status is computed from its
    answer by the same pure function the reconcile calls."""
    init = [
        {"name": RESTORE_CONTAINER, "image": "vllm/vllm-openai:latest"},
        {"name": CAPTURE_CONTAINER, "image": "strata-runtime:test", "restartPolicy": "Always"},
    ]
    body = pod_body("missed", {}, command=["vllm", "serve"])
    create_pod(k8s, namespace, {**body, "spec": {**body["spec"], "initContainers": init}})
    missed = CompileRestoreReport(event="miss", key=KEY, reason=f"holds no compile cache yet for key {KEY[:12]}")
    report_restore(k8s, namespace, "missed", missed, capture_running=True)
    pods = [resource(k8s, "v1", "Pod").get(name="missed", namespace=namespace).to_dict()]
    assert cc.pods_to_read({}, pods) == ["missed"]

    api_client = kubernetes.config.new_client_from_config(config_file=str(control_plane.kubeconfig))
    api_client.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:{LOG_READER}")
    with operator_reads_as(monkeypatch, DynamicClient(api_client)):
        refused = io.read_capture_logs(namespace, ["missed"])
    assert refused.asked and refused.reports == {}
    assert refused.forbidden is not None and 'cannot get resource "pods/log"' in refused.forbidden
    status, events = cc.compile_status({}, pods, store="s", per_node=False, logs=refused)
    assert status["capturing"] == 1 and refused.forbidden in status["captureLogsForbidden"]
    assert [(kind, reason) for kind, reason, _ in events] == [("Warning", cc.LOGS_FORBIDDEN_EVENT)]
    assert cc.capture_poll_seconds(status) is None  # the resync, not every 10 s

    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "capture-logs", "namespace": namespace},
        "rules": [{"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}],
    }
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "capture-logs", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "capture-logs"},
        "subjects": [{"kind": "ServiceAccount", "name": LOG_READER, "namespace": namespace}],
    }
    resource(k8s, "rbac.authorization.k8s.io/v1", "Role").create(body=role, namespace=namespace)
    resource(k8s, "rbac.authorization.k8s.io/v1", "RoleBinding").create(body=binding, namespace=namespace)
    wait_for(
        lambda: service_account_may(k8s, namespace, LOG_READER, "get", "pods", subresource="log", where=namespace),
        timeout=30,
        what="the authorizer to see the grant of pods/log",
    )
    with operator_reads_as(monkeypatch, DynamicClient(api_client)):
        allowed = io.read_capture_logs(namespace, ["missed"])
    assert allowed == cc.CaptureLogs(asked=True)  # read, and no report: a 400, handled as before
    again, events = cc.compile_status({"compileCache": status}, pods, store="s", per_node=False, logs=allowed)
    assert "captureLogsForbidden" not in again and again["capturing"] == 1 and events == []
    assert cc.capture_poll_seconds(again) == cc.CAPTURE_POLL_SECONDS
