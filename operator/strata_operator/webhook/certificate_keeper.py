"""Keeping the webhook's certificate when the operator owns it: the reads and writes around `certificates`.

Runs in every replica (each serves admission), at start before the server loads its files, then every
`CHECK_SECONDS`. Needs only `get`/`patch` on the one Secret and the named webhook configurations (the chart
grants exactly that, by resourceNames); the chart creates the Secret empty, so the operator never creates one.
"""

from __future__ import annotations

import datetime
import logging
import os
from pathlib import Path

from kubernetes.dynamic.exceptions import ConflictError

from strata_operator import kube
from strata_operator.settings import WebhookTLS
from strata_operator.webhook.certificates import ServingTLS, from_secret, issue, renewal_reason, service_names

log = logging.getLogger(__name__)
ADMISSION_API = "admissionregistration.k8s.io/v1"
ROTATED_ANNOTATION = "strata.dev/certificate-issued-by"


class SecretMissing(RuntimeError):
    """The chart's Secret is gone; the operator may not create Secrets."""


def keep(config: WebhookTLS, cert_dir: Path, now: datetime.datetime | None = None) -> ServingTLS:
    """Make the Secret, the files in `cert_dir` and every caBundle agree on a certificate that is not due."""
    now = now or datetime.datetime.now(datetime.UTC)
    namespace, name = config.secret
    names = service_names(*config.service)
    secret = kube.read("v1", "Secret", name, namespace)
    if secret is None:
        raise SecretMissing(
            f"Secret {namespace}/{name} for the webhook's certificate does not exist: `helm upgrade` recreates it "
            "(the operator fills it, but may not create Secrets)"
        )
    tls = from_secret(secret.get("data"))
    reason = renewal_reason(tls, names, now)
    if reason is not None or tls is None:
        tls = _rotate(config, secret, tls, names, now, reason or "no certificate")
    _write_files(cert_dir, tls)
    for kind, configuration in config.configurations:
        _trust(kind, configuration, tls.ca_bundle)
    return tls


def _rotate(
    config: WebhookTLS,
    secret: dict[str, object],
    previous: ServingTLS | None,
    names: list[str],
    now: datetime.datetime,
    reason: str,
) -> ServingTLS:
    namespace, name = config.secret
    fresh = issue(names, now, datetime.timedelta(days=config.validity_days), previous)
    meta = secret.get("metadata") or {}
    assert isinstance(meta, dict)
    body = {
        "metadata": {
            "resourceVersion": meta.get("resourceVersion"),  # another replica may have rotated meanwhile
            "annotations": {ROTATED_ANNOTATION: f"strata-operator at {now:%Y-%m-%dT%H:%M:%SZ}: {reason}"},
        },
        "data": fresh.secret_data(),
    }
    try:
        kube.merge_patch("v1", "Secret", name, namespace, body)
    except ConflictError:
        won = from_secret((kube.read("v1", "Secret", name, namespace) or {}).get("data"))
        if won is None or renewal_reason(won, names, now) is not None:
            raise
        log.info("another replica renewed the webhook certificate first; using its")
        return won
    log.info("webhook certificate renewed (%s); valid until %s", reason, fresh.certificate.not_valid_after_utc)
    return fresh


def _write_files(cert_dir: Path, tls: ServingTLS) -> None:
    """Each file replaced whole (rename), only when it differs; the server reloads when their mtimes change."""
    cert_dir.mkdir(parents=True, exist_ok=True)
    for file, content in tls.files().items():
        path = cert_dir / file
        if path.exists() and path.read_bytes() == content:
            continue
        temporary = cert_dir / f".{file}.new"
        temporary.write_bytes(content)
        os.chmod(temporary, 0o600)
        os.replace(temporary, path)


def _trust(kind: str, name: str, bundle: str) -> None:
    """Set every webhook's caBundle in the configuration (a `test` per index: a reordered list fails, retried)."""
    configuration = kube.read(ADMISSION_API, kind, name)
    if configuration is None:
        log.warning("%s %s does not exist: nothing to trust the webhook certificate in", kind, name)
        return
    ops: list[dict[str, object]] = []
    for i, hook in enumerate(configuration.get("webhooks") or []):
        if (hook.get("clientConfig") or {}).get("caBundle") != bundle:
            ops.append({"op": "test", "path": f"/webhooks/{i}/name", "value": hook["name"]})
            ops.append({"op": "add", "path": f"/webhooks/{i}/clientConfig/caBundle", "value": bundle})
    if ops:
        kube.json_patch(ADMISSION_API, kind, name, None, ops)
        log.info("%s %s now trusts the webhook certificate's CA", kind, name)
