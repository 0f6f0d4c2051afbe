"""Certificates and keys for a throwaway control plane: one CA, a serving cert, client certs (the admin's, and the
one the API server presents to admission webhooks), a service-account key."""

from __future__ import annotations

import datetime
import ipaddress
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


WEBHOOK_CLIENT_NAME = "strata-local-apiserver-webhook-client"
"""The API server's identity towards admission webhooks (a webhook accepts this name among the CA's clients)."""


CONTROLLER_MANAGER_USER = "system:kube-controller-manager"
"""Who kube-controller-manager is towards the API server (and, without --use-service-account-credentials, the
user its controllers create objects as: a DaemonSet's pods, for one)."""
DAEMON_SET_CONTROLLER_USER = "system:serviceaccount:kube-system:daemon-set-controller"
"""Who the DaemonSet controller creates pods as with --use-service-account-credentials."""


def _client_cert(
    subject: x509.Name,
    ca_cert: x509.Certificate,
    ca_key: ec.EllipticCurvePrivateKey,
    validity: tuple[datetime.datetime, datetime.datetime],
) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return cert, key


def write_pki(directory: Path, address: str = "127.0.0.1") -> dict[str, Path]:
    """Write the CA, a serving cert (127.0.0.1, localhost), client certs (admin, controller manager, the API
    server towards webhooks) and the service-account key."""
    now = datetime.datetime.now(datetime.UTC)
    validity = (now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=2))

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("strata-local-ca"))
        .issuer_name(_name("strata-local-ca"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    server_key = ec.generate_private_key(ec.SECP256R1())
    sans = [
        x509.DNSName("localhost"),
        x509.DNSName("kubernetes.default.svc"),
        x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        x509.IPAddress(ipaddress.ip_address("10.0.0.1")),
    ]
    if address != "127.0.0.1":  # where pods on a real node reach the API server
        sans.append(x509.IPAddress(ipaddress.ip_address(address)))
    server_cert = (
        x509.CertificateBuilder()
        .subject_name(_name("kube-apiserver"))
        .issuer_name(ca_cert.subject)
        .public_key(server_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(validity[0])
        .not_valid_after(validity[1])
        .add_extension(x509.SubjectAlternativeName(sans), critical=False)
        .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    admin = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, "strata-admin"),
        ]
    )
    admin_cert, admin_key = _client_cert(admin, ca_cert, ca_key, validity)
    # The controller manager's own user, as clusters name it. In system:masters: without
    # --use-service-account-credentials every controller acts as this user and needs every right.
    controller_manager = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "system:masters"),
            x509.NameAttribute(NameOID.COMMON_NAME, CONTROLLER_MANAGER_USER),
        ]
    )
    cm_cert, cm_key = _client_cert(controller_manager, ca_cert, ca_key, validity)
    webhook_client_cert, webhook_client_key = _client_cert(_name(WEBHOOK_CLIENT_NAME), ca_cert, ca_key, validity)
    sa_key = ec.generate_private_key(ec.SECP256R1())

    files = {
        "ca_crt": (directory / "ca.crt", ca_cert.public_bytes(serialization.Encoding.PEM)),
        "ca_key": (directory / "ca.key", _key_pem(ca_key)),
        "server_crt": (directory / "server.crt", server_cert.public_bytes(serialization.Encoding.PEM)),
        "server_key": (directory / "server.key", _key_pem(server_key)),
        "admin_crt": (directory / "admin.crt", admin_cert.public_bytes(serialization.Encoding.PEM)),
        "admin_key": (directory / "admin.key", _key_pem(admin_key)),
        "webhook_client_crt": (
            directory / "webhook-client.crt",
            webhook_client_cert.public_bytes(serialization.Encoding.PEM),
        ),
        "webhook_client_key": (directory / "webhook-client.key", _key_pem(webhook_client_key)),
        "controller_manager_crt": (
            directory / "controller-manager.crt",
            cm_cert.public_bytes(serialization.Encoding.PEM),
        ),
        "controller_manager_key": (directory / "controller-manager.key", _key_pem(cm_key)),
        "sa_key": (directory / "sa.key", _key_pem(sa_key)),
        "sa_pub": (
            directory / "sa.pub",
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            ),
        ),
    }
    for path, content in files.values():
        path.write_bytes(content)
        path.chmod(0o600)
    return {name: path for name, (path, _) in files.items()}
