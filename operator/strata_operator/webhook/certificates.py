"""The admission webhook's certificate when the operator keeps it (chart: `webhook.tls.managedBy=operator`).

For GitOps installs without cert-manager: Helm's `lookup` does not run under `helm template` or Argo CD, so a
chart-generated pair would be regenerated on every render. Here the chart renders an empty Secret and webhook
configurations without a `caBundle`; every replica of the operator, at start and then every
`CHECK_SECONDS`, makes sure that:
- the Secret holds a serving certificate for the webhook Service's names, valid for more than a third of
  its lifetime (`renewal_reason`); otherwise it issues a new CA and certificate (`issue`) and writes them
  with the Secret's resourceVersion, so two replicas racing write once and the other adopts the winner's;
- the certificate files the webhook server loads (it re-reads them when they change) are the Secret's;
- every `caBundle` of the configured webhook configurations trusts the Secret's CAs.
At a rotation the bundle trusts the new CA and the previous one (while that one is valid), so a replica that
still serves the old certificate for a few seconds is not refused. A fresh CA is made for each certificate and
its key is never stored: nothing can sign another certificate later.

Pure functions here; the reads and writes are in `certificate_keeper.py`.
"""

from __future__ import annotations

import base64
import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CERT_FILE, KEY_FILE, CA_FILE = "tls.crt", "tls.key", "ca.crt"
DEFAULT_VALIDITY = datetime.timedelta(days=365)
CHECK_SECONDS = 3600.0
"""How often each replica re-checks the Secret and the caBundles (a rotation is due a third of the lifetime
before expiry, so an hour is never late)."""


@dataclass(frozen=True)
class ServingTLS:
    """A serving certificate and key, and the CA bundle clients must trust (current CA first)."""

    cert_pem: bytes
    key_pem: bytes
    trusted_pem: bytes

    @property
    def certificate(self) -> x509.Certificate:
        return x509.load_pem_x509_certificate(self.cert_pem)

    @property
    def ca_bundle(self) -> str:
        """The `caBundle` of a webhook configuration: base64 of the PEM bundle."""
        return base64.b64encode(self.trusted_pem).decode()

    def secret_data(self) -> dict[str, str]:
        files = {CERT_FILE: self.cert_pem, KEY_FILE: self.key_pem, CA_FILE: self.trusted_pem}
        return {name: base64.b64encode(content).decode() for name, content in files.items()}

    def files(self) -> dict[str, bytes]:
        return {CERT_FILE: self.cert_pem, KEY_FILE: self.key_pem, CA_FILE: self.trusted_pem}


def service_names(namespace: str, service: str) -> list[str]:
    """The names the API server may use for the webhook's Service."""
    return [service, f"{service}.{namespace}", f"{service}.{namespace}.svc", f"{service}.{namespace}.svc.cluster.local"]


def issue(
    names: Sequence[str],
    now: datetime.datetime,
    validity: datetime.timedelta = DEFAULT_VALIDITY,
    previous: ServingTLS | None = None,
) -> ServingTLS:
    """A new CA and a serving certificate it signed for `names`; the bundle keeps `previous`'s current CA while it
    is still valid (the overlap of a rotation)."""
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{names[0]} webhook CA")])
    start, end = now - datetime.timedelta(minutes=5), now + validity  # a little slack for clock skew
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, names[min(2, len(names) - 1)])]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    trusted = ca.public_bytes(serialization.Encoding.PEM)
    if previous is not None:
        older = [c for c in _certificates(previous.trusted_pem)[:1] if c.not_valid_after_utc > now]
        trusted += b"".join(c.public_bytes(serialization.Encoding.PEM) for c in older)
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return ServingTLS(cert.public_bytes(serialization.Encoding.PEM), key_pem, trusted)


def from_secret(data: Mapping[str, str] | None) -> ServingTLS | None:
    """What a Secret holds, or None when it holds no usable pair (empty, as the chart renders it, or damaged)."""
    if not data or not all(data.get(k) for k in (CERT_FILE, KEY_FILE, CA_FILE)):
        return None
    try:
        tls = ServingTLS(*(base64.b64decode(data[k], validate=True) for k in (CERT_FILE, KEY_FILE, CA_FILE)))
        cert = tls.certificate
        key = serialization.load_pem_private_key(tls.key_pem, password=None)
        if not _certificates(tls.trusted_pem) or key.public_key() != cert.public_key():
            return None
    except ValueError:
        return None
    return tls


def renewal_reason(tls: ServingTLS | None, names: Sequence[str], now: datetime.datetime) -> str | None:
    """Why a new certificate is needed now, or None: missing, for other names, or within the last third of its
    lifetime (so a failing renewal has months of retries before anything expires)."""
    if tls is None:
        return "the Secret holds no certificate yet"
    cert = tls.certificate
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return "the certificate names no DNS names"
    missing = sorted(set(names) - set(san.get_values_for_type(x509.DNSName)))
    if missing:
        return f"the certificate does not name {', '.join(missing)}"
    begins, ends = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now >= ends - (ends - begins) / 3:
        return f"the certificate expires {ends:%Y-%m-%d %H:%M} UTC (renewed in the last third of its lifetime)"
    signers = [c for c in _certificates(tls.trusted_pem) if c.subject == cert.issuer]
    if not signers:
        return "the CA bundle does not hold the certificate's issuer"
    return None


def _certificates(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []
