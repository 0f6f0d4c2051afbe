"""The operator process itself: kopf's settings in one startup hook, login, and the health probe.

`/healthz` (kopf's liveness endpoint) fails while this replica cannot reach the API server, or while
peering has paused every replica (none reconciles); a standby behind one active replica is healthy.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping
from typing import Any

import kopf

from strata_operator import kube
from strata_operator import settings as strata_settings
from strata_operator.api import GROUP
from strata_operator.resources.runtime_image import RuntimeImage, configured_runtime

FINALIZER = f"{GROUP}/finalizer"
PROGRESS_ANNOTATION_PREFIX = GROUP
WATCH_SERVER_TIMEOUT_SECONDS = 300
WATCH_CLIENT_TIMEOUT_SECONDS = 330
API_PROBE_TIMEOUT_SECONDS = 3


def configure(settings: kopf.OperatorSettings, process: strata_settings.Settings | None = None) -> None:
    """Apply Strata's settings; pure enough to unit-test against a fresh OperatorSettings."""
    process = process or strata_settings.current()
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=PROGRESS_ANNOTATION_PREFIX)
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=PROGRESS_ANNOTATION_PREFIX, key="last-handled-configuration"
    )
    # Watches that never time out can go silent behind load balancers; re-list regularly instead.
    settings.watching.server_timeout = WATCH_SERVER_TIMEOUT_SECONDS
    settings.watching.client_timeout = WATCH_CLIENT_TIMEOUT_SECONDS
    settings.watching.connect_timeout = 30
    settings.peering.priority = process.peer_priority
    settings.posting.enabled = True
    settings.posting.level = logging.INFO
    settings.execution.max_workers = 16
    settings.networking.request_timeout = 60
    settings.queueing.error_delays = (1, 2, 5, 10, 30, 60)


def on_startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    process = strata_settings.reload()
    memo["strata"] = process
    configure(settings, process)


def settings_of(memo: kopf.Memo) -> strata_settings.Settings:
    """What the startup hook read; the process's own where a test called a handler without kopf's startup."""
    found = memo.get("strata")
    return found if isinstance(found, strata_settings.Settings) else strata_settings.current()


def runtime_of(settings: strata_settings.Settings) -> RuntimeImage:
    """The builders' `RuntimeImage` from the settings' plain fields."""
    return configured_runtime(settings.runtime_image, settings.runtime_pull_policy, settings.image_pull_secrets)


def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In a pod, the service account; elsewhere $KUBECONFIG as it is when the operator starts."""
    return kopf.login_with_service_account(**kwargs) or kopf.login_with_kubeconfig(**kwargs)


def peering_verdict(
    peers: Mapping[str, Mapping[str, Any]], own_priority: int, now: datetime.datetime | None = None
) -> tuple[bool, str]:
    """(healthy, role) from a kopf peering object's status, judged as kopf judges it.

    kopf pauses a replica when a live peer has a higher priority (standby: healthy, another works) or the
    same one (a tie pauses every replica of that priority: if that is the top, nobody works).
    """
    now = now or datetime.datetime.now(datetime.UTC)
    live = []
    for info in peers.values():
        lastseen = info.get("lastseen")
        seen = datetime.datetime.fromisoformat(lastseen) if lastseen else now
        if seen + datetime.timedelta(seconds=int(info.get("lifetime") or 60)) > now:
            live.append(int(info.get("priority") or 0))
    if not live:
        return True, "starting"
    top = max(live)
    if live.count(top) > 1:
        return False, f"paused: {live.count(top)} replicas share the top peering priority {top}, none reconciles"
    if own_priority == top:
        return True, "active"
    return True, "standby"


def _peering_status(settings: kopf.OperatorSettings) -> Mapping[str, Mapping[str, Any]] | None:
    if settings.peering.standalone or not settings.peering.clusterwide:
        return None  # namespaced peering objects live per namespace; only the API check applies there
    peering = kube.read("kopf.dev/v1", "ClusterKopfPeering", settings.peering.name)
    if peering is None:
        return None
    return dict(peering.get("status") or {})


def readiness_probe(settings: kopf.OperatorSettings, **_: Any) -> str:
    """Raises (kopf answers 500) when this replica cannot do its work; else says which role it has."""
    try:
        kube.api_reachable(timeout=API_PROBE_TIMEOUT_SECONDS)
    except Exception as error:
        raise kopf.PermanentError(f"the API server is unreachable: {error}") from error
    try:
        peers = _peering_status(settings)
    except Exception as error:
        raise kopf.PermanentError(f"cannot read peering {settings.peering.name!r}: {error}") from error
    if peers is None:
        return "active"
    healthy, role = peering_verdict(peers, settings.peering.priority)
    if not healthy:
        raise kopf.PermanentError(role)
    return role
