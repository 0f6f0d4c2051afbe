"""Only the API server gets answers from the admission webhook. The local API server presents its webhook client
certificate (the harness's admission configuration) and the pods it sends come out wired; a caller that reaches the
port directly, with no certificate or with another identity the cluster's CA signed (the admin's), is refused
before its request is read: it learns no claim, ConfigMap or pod name, not even whether a cache exists."""

from __future__ import annotations

import http.client
import json
import ssl
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from strata_operator.api import API_VERSION
from strata_operator.resources.core import KV_TIER_LABEL, MODEL_CACHE_LABEL
from strata_operator.webhook.admission import MUTATE_PODS_PATH, VALIDATE_DELETION_PATH
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.webhook import RunningWebhook

from .test_serving_webhook import create_pod, kv_tier, pod_body, ready_shared_cache

pytestmark = pytest.mark.integration


def review(namespace: str, **request: Any) -> bytes:
    body = {"uid": "probe", "namespace": namespace, **request}
    return json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": body}).encode()


def probe(port: int, path: str, body: bytes, context: ssl.SSLContext) -> str:
    """POST as a direct caller; what came back (status and body), or how the connection was refused."""
    connection = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=30)
    try:
        connection.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        reply = connection.getresponse()
        return f"{reply.status} {reply.read().decode(errors='replace')}"
    except (ssl.SSLError, ConnectionError) as refused:
        return f"refused: {type(refused).__name__}: {refused}"
    finally:
        connection.close()


def prober_context(certificate: tuple[str, str] | None) -> ssl.SSLContext:
    """A prober does not check whom it talks to; it may hold a certificate the cluster's CA signed."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    if certificate is not None:
        context.load_cert_chain(*certificate)
    return context


def test_a_direct_caller_is_refused_and_learns_nothing_while_the_api_server_is_answered(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook, control_plane: Any
) -> None:
    cache, tier = ready_shared_cache(k8s, namespace), kv_tier(k8s, namespace)
    labels = {MODEL_CACHE_LABEL: cache, KV_TIER_LABEL: tier}
    wired = create_pod(k8s, namespace, pod_body("consumer", labels))  # the API server, with its client certificate
    assert f"{cache}-model" in json.dumps(wired["spec"]), "the API server's call was answered and the pod wired"
    # The counters are the server's, for every namespace: earlier tests' namespaces still being deleted send
    # deletion reviews of their caches. Once none is left terminating, only this test's calls can move them.
    wait_for(
        lambda: not [n for n in resource(k8s, "v1", "Namespace").get().items if n.status.phase == "Terminating"],
        timeout=300,
        interval=0.5,
        what="earlier tests' namespaces gone",
    )
    sent = (pod_webhook.requests, pod_webhook.deletion_requests)

    pod = {"metadata": {"labels": labels}, "spec": {"containers": [{"name": "probe", "image": "busybox"}]}}
    mutate = review(namespace, kind={"kind": "Pod"}, operation="CREATE", object=pod)
    absent = {**pod, "metadata": {"labels": {MODEL_CACHE_LABEL: "no-such-cache"}}}
    existence = review(namespace, kind={"kind": "Pod"}, operation="CREATE", object=absent)
    old = {"apiVersion": API_VERSION, "kind": "ModelCache", "metadata": {"name": cache, "namespace": namespace}}
    delete = review(namespace, kind={"kind": "ModelCache"}, operation="DELETE", name=cache, oldObject=old)
    admin = (str(control_plane.pki["admin_crt"]), str(control_plane.pki["admin_key"]))
    answers = [
        probe(pod_webhook.port, path, body, prober_context(certificate))
        for certificate in (None, admin)
        for path, body in ((MUTATE_PODS_PATH, mutate), (MUTATE_PODS_PATH, existence), (VALIDATE_DELETION_PATH, delete))
    ]
    for answer in answers[:3]:
        assert answer.startswith("refused: "), f"a caller without a client certificate got: {answer[:300]}"
    for answer in answers[3:]:
        assert answer == "403 this client certificate is not accepted", f"the admin's certificate got: {answer[:300]}"
    leaked = [name for name in (cache, tier, "consumer", namespace, "no-such-cache") if name in "".join(answers)]
    assert not leaked, f"a direct caller learned {leaked}"
    assert (pod_webhook.requests, pod_webhook.deletion_requests) == sent, "a direct call reached a decision"

    create_pod(k8s, namespace, pod_body("consumer-2", labels))  # the API server is still answered
    assert pod_webhook.requests == sent[0] + 1
