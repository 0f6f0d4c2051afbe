"""Every setting the operator process reads from its environment, read once, in one place.

- `STRATA_RUNTIME_IMAGE`: image of the Jobs and DaemonSets the operator renders (default: this release's
  `ghcr.io/strata-dev/strata-runtime:<version>`).
- `STRATA_RUNTIME_IMAGE_PULL_POLICY`: their pull policy where the spec names neither an image nor a policy
  (default `IfNotPresent`).
- `STRATA_IMAGE_PULL_SECRETS`: comma-separated Secret names for those pods' `imagePullSecrets` (each pod looks
  them up in its own namespace; default none).
- `STRATA_MODELCACHE_RESYNC_SECONDS`: how often every ModelCache is re-checked without a watch event (60).
- `STRATA_WEBHOOK_CERT_DIR`: directory with the pod admission webhook's `tls.crt` and `tls.key` (the chart
  mounts its Secret there); the webhook is served only when set.
- `STRATA_WEBHOOK_PORT`: the port it listens on (default 9443).
- `STRATA_WEBHOOK_TLS_SECRET`: `namespace/name` of a Secret the operator keeps filled with the webhook's CA and
  certificate (chart `webhook.tls.managedBy=operator`); it then writes the files into the cert dir itself
  and keeps the `caBundle` of `STRATA_WEBHOOK_CONFIGURATIONS` (`Kind/name,...`) trusting them, for the
  names of `STRATA_WEBHOOK_SERVICE` (`namespace/name`). `STRATA_WEBHOOK_CERT_VALIDITY_DAYS`: the
  certificate's lifetime (365); it is renewed in the last third.
- `STRATA_WEBHOOK_CLIENT_CA`: a PEM file of the CAs that sign the API server's webhook client certificate. When
  set, the webhook completes a TLS handshake only with a client that presents a certificate they signed; unset,
  anyone who reaches its port can ask it (a warning at start). `STRATA_WEBHOOK_CLIENT_NAMES`: comma-separated
  names (certificate common name or DNS SAN) to accept among those; needed where the CA signs other clients too.
- `STRATA_WEBHOOK_MAX_BODY_BYTES` (3 MiB), `STRATA_WEBHOOK_MAX_CONCURRENT` (8 decisions at once),
  `STRATA_WEBHOOK_MAX_QUEUED` (24 waiting for one): the work one caller can make the webhook do; a request beyond
  them is answered 413 or 429 at once.
- `STRATA_METRICS_PORT`: where the operator serves Prometheus /metrics (the KVCacheTiers' offload verdicts as
  gauges); not served when unset (0: any free port).
- `POD_ID`: this replica's peering identity (the chart sets the pod name; default hostname/pid/random).
- `KUBECONFIG`: the kubeconfig outside a cluster, read when the client is made (`kube.py` reads the settings
  anew then: tests switch clusters within one process).

Nothing else in `strata_operator` calls `os.environ`; builders take what they need as arguments
(`operator/tests/unit/test_cli_and_settings.py` keeps it so). Plain values only: this module imports nothing of
the operator's, so every layer may read the settings and none drags in another's code (the handlers turn the
runtime fields into the builders' `RuntimeImage`).
"""

from __future__ import annotations

import functools
import hashlib
import os
import secrets
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field

RUNTIME_IMAGE_ENV = "STRATA_RUNTIME_IMAGE"
RUNTIME_IMAGE_PULL_POLICY_ENV = "STRATA_RUNTIME_IMAGE_PULL_POLICY"
IMAGE_PULL_SECRETS_ENV = "STRATA_IMAGE_PULL_SECRETS"
MODELCACHE_RESYNC_ENV = "STRATA_MODELCACHE_RESYNC_SECONDS"
WEBHOOK_CERT_DIR_ENV = "STRATA_WEBHOOK_CERT_DIR"
WEBHOOK_PORT_ENV = "STRATA_WEBHOOK_PORT"
DEFAULT_WEBHOOK_PORT = 9443
WEBHOOK_TLS_SECRET_ENV = "STRATA_WEBHOOK_TLS_SECRET"
WEBHOOK_SERVICE_ENV = "STRATA_WEBHOOK_SERVICE"
WEBHOOK_CONFIGURATIONS_ENV = "STRATA_WEBHOOK_CONFIGURATIONS"
WEBHOOK_CERT_VALIDITY_ENV = "STRATA_WEBHOOK_CERT_VALIDITY_DAYS"
WEBHOOK_CLIENT_CA_ENV = "STRATA_WEBHOOK_CLIENT_CA"
WEBHOOK_CLIENT_NAMES_ENV = "STRATA_WEBHOOK_CLIENT_NAMES"
WEBHOOK_MAX_BODY_ENV = "STRATA_WEBHOOK_MAX_BODY_BYTES"
WEBHOOK_MAX_CONCURRENT_ENV = "STRATA_WEBHOOK_MAX_CONCURRENT"
WEBHOOK_MAX_QUEUED_ENV = "STRATA_WEBHOOK_MAX_QUEUED"
WEBHOOK_CONFIGURATION_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
POD_ID_ENV = "POD_ID"
METRICS_PORT_ENV = "STRATA_METRICS_PORT"
KUBECONFIG_ENV = "KUBECONFIG"
PULL_POLICIES = ("Always", "IfNotPresent", "Never")


def unique_identity() -> str:
    """An identity no other process shares, even on the same host: two replicas that tie on priority both pause."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


def peer_priority(identity: str) -> int:
    """A stable priority per replica: kopf pauses every peer whose priority is equal or higher than its
    own, so replicas with one shared priority would all stand by; distinct ones leave exactly one active."""
    return 1 + int.from_bytes(hashlib.sha256(identity.encode()).digest()[:4], "big") % (2**30)


@dataclass(frozen=True)
class WebhookTLS:
    """What the operator needs to keep the webhook's certificate itself (see `webhook_tls`)."""

    secret: tuple[str, str]  # namespace, name
    service: tuple[str, str]
    configurations: tuple[tuple[str, str], ...]  # kind, name
    validity_days: int = 365


@dataclass(frozen=True)
class WebhookAccess:
    """Who may call the admission webhook and how much work callers can make it do at once (see `admission`).

    3 MiB is the API server's own limit on a request body, so any object it admits fits; 8 decisions (each at
    most two GETs or one LIST) and 24 waiting keep a burst of pod creations queued rather than refused, while
    at most 32 request bodies are held at once."""

    client_ca: str | None = None
    client_names: tuple[str, ...] = ()
    max_body_bytes: int = 3 * 1024 * 1024
    max_concurrent: int = 8
    max_queued: int = 24


def _positive(env: Mapping[str, str], variable: str, default: int) -> int:
    value = env.get(variable) or str(default)
    if not value.isdigit() or int(value) < 1:
        raise ValueError(f"{variable}={value!r}: give a whole number of at least 1 (default {default})")
    return int(value)


def _webhook_access(env: Mapping[str, str]) -> WebhookAccess:
    defaults = WebhookAccess()
    names = tuple(n.strip() for n in (env.get(WEBHOOK_CLIENT_NAMES_ENV) or "").split(",") if n.strip())
    client_ca = env.get(WEBHOOK_CLIENT_CA_ENV) or None
    if names and client_ca is None:
        raise ValueError(
            f"{WEBHOOK_CLIENT_NAMES_ENV} is set but {WEBHOOK_CLIENT_CA_ENV} is not: names are checked only on "
            "certificates the client CA signed"
        )
    return WebhookAccess(
        client_ca=client_ca,
        client_names=names,
        max_body_bytes=_positive(env, WEBHOOK_MAX_BODY_ENV, defaults.max_body_bytes),
        max_concurrent=_positive(env, WEBHOOK_MAX_CONCURRENT_ENV, defaults.max_concurrent),
        max_queued=_positive(env, WEBHOOK_MAX_QUEUED_ENV, defaults.max_queued),
    )


def _namespaced(env: Mapping[str, str], variable: str) -> tuple[str, str]:
    value = env.get(variable) or ""
    namespace, _, name = value.partition("/")
    if not namespace or not name or "/" in name:
        raise ValueError(f"{variable}={value!r}: give namespace/name")
    return namespace, name


def _webhook_tls(env: Mapping[str, str]) -> WebhookTLS | None:
    if not env.get(WEBHOOK_TLS_SECRET_ENV):
        return None
    configurations = []
    for item in (env.get(WEBHOOK_CONFIGURATIONS_ENV) or "").split(","):
        kind, _, name = item.strip().partition("/")
        if kind not in WEBHOOK_CONFIGURATION_KINDS or not name:
            raise ValueError(
                f"{WEBHOOK_CONFIGURATIONS_ENV}: {item!r} is not Kind/name with Kind one of "
                f"{', '.join(WEBHOOK_CONFIGURATION_KINDS)}"
            )
        configurations.append((kind, name))
    days = env.get(WEBHOOK_CERT_VALIDITY_ENV) or "365"
    if not days.isdigit() or not 1 <= int(days) <= 3650:
        raise ValueError(f"{WEBHOOK_CERT_VALIDITY_ENV}={days!r}: give whole days from 1 to 3650")
    return WebhookTLS(
        _namespaced(env, WEBHOOK_TLS_SECRET_ENV),
        _namespaced(env, WEBHOOK_SERVICE_ENV),
        tuple(configurations),
        int(days),
    )


@dataclass(frozen=True)
class Settings:
    runtime_image: str | None = None
    """The configured runtime image; None: this release's (`resources/runtime_image.release_image`)."""
    runtime_pull_policy: str = "IfNotPresent"
    image_pull_secrets: tuple[str, ...] = ()
    modelcache_resync_seconds: float = 60.0
    identity: str = field(default_factory=unique_identity)
    webhook_cert_dir: str | None = None
    webhook_port: int = DEFAULT_WEBHOOK_PORT
    webhook_tls: WebhookTLS | None = None
    webhook_access: WebhookAccess = field(default_factory=WebhookAccess)
    kubeconfig: str | None = None
    metrics_port: int | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and check every setting; a bad value stops the operator at start with the variable's name."""
        env = os.environ if environ is None else environ
        policy = env.get(RUNTIME_IMAGE_PULL_POLICY_ENV) or "IfNotPresent"
        if policy not in PULL_POLICIES:
            raise ValueError(f"{RUNTIME_IMAGE_PULL_POLICY_ENV}={policy!r}: use one of {', '.join(PULL_POLICIES)}")
        pull_secrets = tuple(s.strip() for s in (env.get(IMAGE_PULL_SECRETS_ENV) or "").split(",") if s.strip())
        resync = env.get(MODELCACHE_RESYNC_ENV) or "60"
        try:
            resync_seconds = float(resync)
        except ValueError:
            raise ValueError(f"{MODELCACHE_RESYNC_ENV}={resync!r}: give a number of seconds") from None
        port = env.get(WEBHOOK_PORT_ENV) or str(DEFAULT_WEBHOOK_PORT)
        if not port.isdigit() or int(port) > 65535:
            raise ValueError(f"{WEBHOOK_PORT_ENV}={port!r}: give a TCP port number (0: any free port)")
        return cls(
            runtime_image=env.get(RUNTIME_IMAGE_ENV) or None,
            runtime_pull_policy=policy,
            image_pull_secrets=pull_secrets,
            modelcache_resync_seconds=resync_seconds,
            identity=env.get(POD_ID_ENV) or unique_identity(),
            webhook_cert_dir=env.get(WEBHOOK_CERT_DIR_ENV) or None,
            webhook_port=int(port),
            webhook_tls=_webhook_tls(env),
            webhook_access=_webhook_access(env),
            kubeconfig=env.get(KUBECONFIG_ENV) or None,
            metrics_port=_metrics_port(env),
        )

    @property
    def peer_priority(self) -> int:
        return peer_priority(self.identity)


def _metrics_port(env: Mapping[str, str]) -> int | None:
    port = env.get(METRICS_PORT_ENV)
    if not port:
        return None
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"{METRICS_PORT_ENV}={port!r}: give a TCP port number (0: any free port)")
    return int(port)


@functools.cache
def current() -> Settings:
    """The process's settings, read on first use (the startup hook reads them before any handler runs)."""
    return Settings.from_env()


def reload() -> Settings:
    """Read the environment again (tests that change it; the in-process operator between sessions)."""
    current.cache_clear()
    return current()
