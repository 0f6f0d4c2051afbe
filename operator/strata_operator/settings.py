"""Operator-wide kopf settings, set in one startup hook."""

from __future__ import annotations

import hashlib
import logging
import os
import socket
from typing import Any

import kopf

from strata_operator.api import GROUP

FINALIZER = f"{GROUP}/finalizer"
PROGRESS_ANNOTATION_PREFIX = GROUP
LAST_HANDLED_ANNOTATION = f"{GROUP}/last-handled-configuration"
WATCH_SERVER_TIMEOUT_SECONDS = 300
WATCH_CLIENT_TIMEOUT_SECONDS = 330


def peer_priority(pod_id: str) -> int:
    """A stable priority per replica: kopf pauses every peer whose priority is equal or higher than its
    own, so replicas with one shared priority would all stand by; distinct ones leave exactly one active."""
    return 1 + int.from_bytes(hashlib.sha256(pod_id.encode()).digest()[:4], "big") % (2**30)


def configure(settings: kopf.OperatorSettings) -> None:
    """Apply Strata's settings; pure enough to unit-test against a fresh OperatorSettings."""
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PROGRESS_ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PROGRESS_ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    # Watches that never time out can go silent behind load balancers; re-list regularly instead.
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_SECONDS
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_SECONDS
    settings.watching.connect_timeout = 30
    settings.peering.priority = peer_priority(os.environ.get("POD_ID") or socket.gethostname())
    settings.posting.enabled = True
    settings.posting.level = logging.INFO
    settings.execution.max_workers = 16
    settings.networking.request_timeout = 60
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)


@kopf.on.startup()
def on_startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    configure(settings)


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod, the service account; elsewhere $KUBECONFIG as it is when the operator starts."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


kopf.on.login()(login)


@kopf.on.probe(id="ready")
def readiness_probe(**_: Any) -> bool:
    return True
