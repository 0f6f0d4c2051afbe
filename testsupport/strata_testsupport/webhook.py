"""The pod admission webhook for tests: Strata's server on loopback with a throwaway CA, and a real
MutatingWebhookConfiguration so that the local kube-apiserver itself calls it over TLS.

The server runs in a thread of the test process (its own event loop), apart from the session's operator, so a
test can stop it and start it again on the same port. The session's webhook accepts only the API server: a client
certificate signed by the local cluster's CA and named `WEBHOOK_CLIENT_NAME` (`api_server_access`), which the
harness has the API server present to every webhook. The configuration mirrors the chart's
(`charts/strata/templates/webhook.yaml`): one webhook per opt-in label, chosen by objectSelector.
"""

from __future__ import annotations

import asyncio
import base64
import datetime
import ipaddress
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from kubernetes.dynamic import DynamicClient

from strata_testsupport.apirequests import as_operator
from strata_testsupport.kube import resource
from strata_testsupport.localcluster.pki import WEBHOOK_CLIENT_NAME

CONFIGURATION_NAME = "strata-test-pod-wiring"
WEBHOOK_TIMEOUT_SECONDS = 5


def write_webhook_tls(directory: Path, address: str = "127.0.0.1") -> bytes:
    """A CA and a serving certificate for `address` (tls.crt, tls.key in `directory`); returns the CA's PEM. The
    test registry serves with one too (strata_testsupport.registry)."""
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("strata-webhook-test-ca"))
        .issuer_name(name("strata-webhook-test-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    leaf = (
        x509.CertificateBuilder()
        .subject_name(name("strata-webhook"))
        .issuer_name(ca.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(address))]), False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "tls.crt").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
    (directory / "tls.key").write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return ca.public_bytes(serialization.Encoding.PEM)


def write_client_certificates(directory: Path, *names: str) -> Path:
    """A client CA (`client-ca.crt`, returned) and, per name, `<name>.crt` and `<name>.key` it signed for that name:
    the identities a webhook's callers present."""
    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=1)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "strata-webhook-test-client-ca")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        leaf = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start)
            .not_valid_after(end)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        (directory / f"{name}.crt").write_bytes(leaf.public_bytes(serialization.Encoding.PEM))
        (directory / f"{name}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
    (directory / "client-ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    return directory / "client-ca.crt"


def webhook_configuration(name: str, url: str, ca_pem: bytes, timeout: int = WEBHOOK_TIMEOUT_SECONDS) -> dict[str, Any]:
    from strata_operator.resources.core import KV_TIER_LABEL, MODEL_CACHE_LABEL

    def webhook(label: str, short: str, *unless: str) -> dict[str, Any]:
        selector = [{"key": label, "operator": "Exists"}] + [{"key": k, "operator": "DoesNotExist"} for k in unless]
        return {
            "name": f"{short}.pods.strata.dev",
            "admissionReviewVersions": ["v1"],
            "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
            "rules": [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"], "resources": ["pods"]}],
            "objectSelector": {"matchExpressions": selector},
            "failurePolicy": "Fail",
            "sideEffects": "None",
            "timeoutSeconds": timeout,
            "reinvocationPolicy": "Never",
        }

    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": name},
        # A pod with both labels goes to the first alone, which wires both.
        "webhooks": [
            webhook(MODEL_CACHE_LABEL, "model-cache"),
            webhook(KV_TIER_LABEL, "kv-cache-tier", MODEL_CACHE_LABEL),
        ],
    }


def deletion_webhook_configuration(name: str, url: str, ca_pem: bytes) -> dict[str, Any]:
    """Deleting a ModelCache or KVCacheTier that pods use is refused; an outage lets deletions through (Ignore)."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": name},
        "webhooks": [
            {
                "name": "deletion.caches.strata.dev",
                "admissionReviewVersions": ["v1"],
                "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_pem).decode()},
                "rules": [
                    {
                        "operations": ["DELETE"],
                        "apiGroups": ["strata.dev"],
                        "apiVersions": ["v1alpha1"],
                        "resources": ["modelcaches", "kvcachetiers"],
                    }
                ],
                "failurePolicy": "Ignore",
                "sideEffects": "None",
                "timeoutSeconds": WEBHOOK_TIMEOUT_SECONDS,
            }
        ],
    }


def api_server_access(control_plane: Any) -> Any:
    """The `WebhookAccess` that admits the local API server alone (its webhook client certificate)."""
    from strata_operator.settings import WebhookAccess

    return WebhookAccess(client_ca=str(control_plane.pki["ca_crt"]), client_names=(WEBHOOK_CLIENT_NAME,))


@dataclass
class RunningWebhook:
    """Strata's AdmissionServer on 127.0.0.1 in a thread; `stop()` and `start()` keep the port."""

    cert_dir: Path
    port: int = 0
    access: Any = None
    """A `WebhookAccess`; None: the server's default (any caller)."""
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop)
    _thread: threading.Thread | None = None
    _server: Any = None

    @property
    def url(self) -> str:
        from strata_operator.webhook.admission import MUTATE_PODS_PATH

        return f"https://127.0.0.1:{self.port}{MUTATE_PODS_PATH}"

    @property
    def deletion_url(self) -> str:
        from strata_operator.webhook.admission import VALIDATE_DELETION_PATH

        return f"https://127.0.0.1:{self.port}{VALIDATE_DELETION_PATH}"

    @property
    def requests(self) -> int:
        return int(self._server.requests) if self._server is not None else 0

    @property
    def deletion_requests(self) -> int:
        return int(self._server.deletion_requests) if self._server is not None else 0

    def start(self) -> None:
        from strata_operator.webhook.admission import AdmissionServer

        if self._thread is None:
            self._thread = threading.Thread(target=self._loop.run_forever, name="strata-webhook", daemon=True)
            self._thread.start()
        previous = (self.requests, self.deletion_requests)
        server = AdmissionServer(self.cert_dir, host="127.0.0.1", port=self.port)
        if self.access is not None:
            server.access = self.access
        # Started as the operator's: the tasks that serve admission carry the mark of its API requests.
        as_operator(asyncio.run_coroutine_threadsafe, server.start(), self._loop).result(timeout=30)
        server.requests, server.deletion_requests = previous
        self.port, self._server = server.port, server

    def stop(self) -> None:
        if self._server is not None:
            asyncio.run_coroutine_threadsafe(self._server.stop(), self._loop).result(timeout=30)

    def close(self) -> None:
        self.stop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)


@pytest.fixture(scope="session")
def pod_webhook(
    control_plane: Any, k8s: DynamicClient, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningWebhook]:
    """The webhook serving the API server alone, registered with it for the whole session; removed at the end."""
    cert_dir = tmp_path_factory.mktemp("webhook-tls")
    ca = write_webhook_tls(cert_dir)
    running = RunningWebhook(cert_dir, access=api_server_access(control_plane))
    running.start()
    configurations = resource(k8s, "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")
    configurations.create(body=webhook_configuration(CONFIGURATION_NAME, running.url, ca))
    validating = resource(k8s, "admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration")
    validating.create(body=deletion_webhook_configuration(CONFIGURATION_NAME, running.deletion_url, ca))
    try:
        yield running
    finally:
        configurations.delete(name=CONFIGURATION_NAME)
        validating.delete(name=CONFIGURATION_NAME)
        running.close()
