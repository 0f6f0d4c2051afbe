"""kopf entry points for KVCacheTier: thin triggers; all of them run the same level-based reconcile.

- the resource itself: create, update (spec or labels), resume after an operator restart;
- its children (DaemonSet, ConfigMaps, Service, PVC): a hand edit or deletion is put back at once, and a
  DaemonSet status change (pods becoming ready) refreshes the status;
- a timer: the safety net for anything a missed watch event would leave behind.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import kopf

from strata_operator.api import GROUP, VERSION
from strata_operator.handlers import kvcachetier_io as io
from strata_operator.handlers import kvcachetier_reconcile as reconciler
from strata_operator.handlers import kvcachetier_usage as usage
from strata_operator.resources.core import MANAGED_BY, MANAGED_BY_LABEL
from strata_operator.resources.kvcachetier.names import APP_NAME, KIND, NAME_LABEL
from strata_operator.settings import Settings

PLURAL = "kvcachetiers"
DRIFT_INTERVAL_SECONDS = 60.0
CHILD_LABELS = {MANAGED_BY_LABEL: MANAGED_BY, NAME_LABEL: APP_NAME}
_CHILD_KINDS = (
    ("apps", "v1", "daemonsets"),
    ("", "v1", "configmaps"),
    ("", "v1", "services"),
    ("", "v1", "persistentvolumeclaims"),
)


def _settings(memo: kopf.Memo) -> Settings | None:
    """What the startup hook read (absent only when a test registry skipped it)."""
    found = memo.get("strata")
    return found if isinstance(found, Settings) else None


MAX_RETRY_DELAY_SECONDS = 300.0


def retry_delay(retry: int) -> float:
    """5 s doubling per failed attempt up to 5 min: an unforeseen failure is retried, never in a tight loop
    (a spec problem ends in a condition instead; the drift timer re-runs the reconcile anyway)."""
    return float(min(MAX_RETRY_DELAY_SECONDS, 5.0 * 2 ** min(retry, 16)))


def _reconcile(body: Mapping[str, Any], memo: kopf.Memo, *, full: bool = True, retry: int = 0) -> None:
    try:
        reconciler.reconcile(body, full=full, settings=_settings(memo))
    except kopf.PermanentError:
        raise
    except Exception as error:  # kopf retries after the delay; the message says what failed.
        raise kopf.TemporaryError(f"reconcile failed: {error}", delay=retry_delay(retry)) from error


@kopf.on.resume(GROUP, VERSION, PLURAL)
@kopf.on.create(GROUP, VERSION, PLURAL)
@kopf.on.update(GROUP, VERSION, PLURAL)
def tier_changed(body: kopf.Body, memo: kopf.Memo, retry: int, **_: Any) -> None:
    _reconcile(body, memo, retry=retry)


@kopf.timer(GROUP, VERSION, PLURAL, interval=DRIFT_INTERVAL_SECONDS, initial_delay=DRIFT_INTERVAL_SECONDS)
def tier_drift(body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    _reconcile(body, memo)
    current = io.read_tier(body["metadata"]["name"], body["metadata"]["namespace"])
    if current is not None:
        try:
            usage.refresh_usage(current)
        except Exception:  # metrics are informative: a failed scrape never fails the reconcile
            logger.exception("scraping the KV servers' metrics failed")


def owning_tier(body: Mapping[str, Any]) -> str | None:
    """The KVCacheTier that controls this child, if any."""
    for ref in body.get("metadata", {}).get("ownerReferences") or []:
        if ref.get("kind") == KIND and ref.get("apiVersion", "").startswith(f"{GROUP}/") and ref.get("controller"):
            return str(ref["name"])
    return None


def child_event_action(event_type: str | None, body: Mapping[str, Any]) -> Literal["skip", "status", "full"]:
    """What a child's watch event asks for.

    Our own creations (ADDED) and writes (the resourceVersion our apply returned) need nothing; a
    DaemonSet whose spec generation is still ours only changed status (pods becoming ready); anything
    else — a deletion, a hand edit — re-applies the children.
    """
    if event_type in (None, "ADDED"):  # None: the initial listing, which `resume` on the owner covers
        return "skip"
    if event_type == "DELETED":
        return "full"
    meta = body.get("metadata", {})
    applied = reconciler.applied_children.get((body.get("kind", ""), meta.get("namespace", ""), meta.get("name", "")))
    if applied is None:
        return "full"
    if meta.get("resourceVersion") == applied.resource_version:
        return "skip"
    if body.get("kind") == "DaemonSet" and int(meta.get("generation") or 0) == applied.generation:
        return "status"
    return "full"


def _child_event(event: kopf.RawEvent, body: kopf.Body, memo: kopf.Memo, logger: kopf.Logger, **_: Any) -> None:
    owner = owning_tier(body)
    action = child_event_action(event.get("type"), body)
    if owner is None or action == "skip":
        return
    try:
        target = {"metadata": {"name": owner, "namespace": body["metadata"]["namespace"]}}
        reconciler.reconcile(target, full=action == "full", settings=_settings(memo))
    except Exception:  # events are not retried: the timer converges later
        logger.exception("reconcile of KVCacheTier %s after a %s event failed", owner, body.get("kind"))


def _register_child_watches() -> None:
    for group, version, plural in _CHILD_KINDS:
        kopf.on.event(group, version, plural, labels=CHILD_LABELS, id=f"kvcachetier-{plural}")(_child_event)


_register_child_watches()
