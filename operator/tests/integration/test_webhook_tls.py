"""The operator keeps its webhook's certificate (`webhook.tls.managedBy=operator`) against the real API server:
it fills the chart's empty Secret, writes the files the admission server loads and the caBundle the API server
trusts, and the API server then calls the webhook over TLS with that certificate; a certificate due for renewal
is replaced while the previous CA stays trusted, and a replica that lost the race adopts the winner's pair.

The Service is named `localhost` so that one of its names is what the API server dials here (no cluster DNS or
Service routing in this control plane); everything else is the product's code path."""

from __future__ import annotations

import base64
import datetime
from pathlib import Path

import pytest
from cryptography import x509
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ApiException
from strata_operator import kube
from strata_operator.resources.core import MODEL_CACHE_LABEL
from strata_operator.settings import WebhookTLS
from strata_operator.webhook import certificate_keeper
from strata_operator.webhook.certificates import from_secret, issue, service_names
from strata_testsupport.kube import resource
from strata_testsupport.processes import free_port
from strata_testsupport.webhook import RunningWebhook, webhook_configuration

pytestmark = pytest.mark.integration
ADMISSION = "admissionregistration.k8s.io/v1"


def _refusal(k8s: DynamicClient, namespace: str, name: str) -> str:
    """Create a pod naming a ModelCache that does not exist: only the webhook itself refuses it with `strata:`."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {MODEL_CACHE_LABEL: "absent"}},
        "spec": {"containers": [{"name": "main", "image": "busybox"}]},
    }
    with pytest.raises(ApiException) as refused:
        resource(k8s, "v1", "Pod").create(body=pod, namespace=namespace)
    return str(refused.value.body)


def test_the_operator_issues_trusts_serves_and_rotates_its_webhook_certificate(
    k8s: DynamicClient, strata_crds: object, namespace: str, tmp_path: Path
) -> None:
    secrets = resource(k8s, "v1", "Secret")
    secrets.create(
        namespace=namespace,
        body={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "webhook-tls"}, "type": "Opaque"},
    )
    port, name = free_port(), f"strata-kept-{namespace}"
    configuration = webhook_configuration(name, f"https://localhost:{port}/mutate-pods", b"")
    for hook in configuration["webhooks"]:
        del hook["clientConfig"]["caBundle"]  # as the chart renders it in this mode
        hook["namespaceSelector"] = {"matchLabels": {"kubernetes.io/metadata.name": namespace}}
    configurations = resource(k8s, ADMISSION, "MutatingWebhookConfiguration")
    configurations.create(body=configuration)
    kept = WebhookTLS((namespace, "webhook-tls"), (namespace, "localhost"), (("MutatingWebhookConfiguration", name),))
    cert_dir = tmp_path / "certs"
    server = RunningWebhook(cert_dir, port=port)
    try:
        first = certificate_keeper.keep(kept, cert_dir)
        stored = secrets.get(name="webhook-tls", namespace=namespace).to_dict()
        assert from_secret(stored["data"]) == first, "the Secret holds the pair"
        assert (cert_dir / "tls.crt").read_bytes() == first.cert_pem
        hooks = configurations.get(name=name).to_dict()["webhooks"]
        assert {h["clientConfig"]["caBundle"] for h in hooks} == {first.ca_bundle}
        server.start()
        refused = _refusal(k8s, namespace, "first")
        assert "strata: ModelCache 'absent'" in refused and "x509" not in refused, refused
        assert certificate_keeper.keep(kept, cert_dir) == first, "a pair that is not due stays"

        # A certificate in the last third of its life (as if issued 300 days ago for a year) is renewed.
        now = datetime.datetime.now(datetime.UTC)
        old = issue(service_names(namespace, "localhost"), now - datetime.timedelta(days=300))
        stale = dict(secrets.get(name="webhook-tls", namespace=namespace).to_dict())
        kube.merge_patch("v1", "Secret", "webhook-tls", namespace, {"data": old.secret_data()})
        due = kube.read("v1", "Secret", "webhook-tls", namespace)
        assert due is not None
        rotated = certificate_keeper.keep(kept, cert_dir)
        assert rotated != old and rotated.certificate.not_valid_after_utc > now + datetime.timedelta(days=300)
        current_ca, previous_ca = x509.load_pem_x509_certificates(rotated.trusted_pem)
        rotated.certificate.verify_directly_issued_by(current_ca)
        assert previous_ca == x509.load_pem_x509_certificates(old.trusted_pem)[0], "the previous CA stays trusted"
        old.certificate.verify_directly_issued_by(previous_ca)
        hooks = configurations.get(name=name).to_dict()["webhooks"]
        assert {h["clientConfig"]["caBundle"] for h in hooks} == {rotated.ca_bundle}
        annotations = secrets.get(name="webhook-tls", namespace=namespace).to_dict()["metadata"]["annotations"]
        assert "expires" in annotations[certificate_keeper.ROTATED_ANNOTATION], annotations
        server.stop()
        server.start()  # load the new files now (the server also reloads by itself when they change)
        refused = _refusal(k8s, namespace, "second")
        assert "strata: ModelCache 'absent'" in refused and "x509" not in refused, refused

        # A replica that read the Secret before another rotated it loses the write and adopts the winner's pair.
        assert stale["metadata"]["resourceVersion"] != due["metadata"]["resourceVersion"]
        adopted = certificate_keeper._rotate(
            kept, due, old, service_names(namespace, "localhost"), now, "the certificate expires soon"
        )
        assert adopted == rotated
        assert (
            base64.b64decode(secrets.get(name="webhook-tls", namespace=namespace).to_dict()["data"]["tls.crt"])
            == rotated.cert_pem
        ), "the loser wrote nothing"
    finally:
        server.close()
        configurations.delete(name=name)
