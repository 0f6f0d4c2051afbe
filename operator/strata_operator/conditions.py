"""The condition vocabulary of every kind, the Events their transitions emit (one table), and the helper that
sets a condition: lastTransitionTime moves only when the status flips.

GitOps verdicts. Flux judges health with kstatus, which reads, in this order: a deletionTimestamp (Terminating),
observedGeneration behind metadata.generation (InProgress), then the first of Reconciling=True (InProgress) and
Stalled=True (Failed) in the list, then Ready (True: Current, else InProgress). The Argo CD health check the chart
README ships reads them in the same order (Progressing, Progressing, Progressing / Degraded, Healthy /
Progressing), so both tools say the same of every status. What the operator sets makes the verdict mean this:
- InProgress: Reconciling, whether or not the resource is usable meanwhile: a preload, a pre-pull, a rollout, a
  retry after a transient failure, a node that is not Ready (a copy or server waits for it to return or for its
  Node to be deleted: nothing in the resource for a person to fix; Flux waits, as it does for a DaemonSet whose
  pod's node is down). Ready=True with Reconciling=True is InProgress: a ModelCache usable on the other nodes
  while one is lost, or an ImageVolume that pods mount while its pre-pulls run.
- Failed: Stalled, set whenever something failed and nothing in progress will mend it (ModelCache: Degraded
  and not Reconciling, even while usable; KVCacheTier: ConfigValid False).
- Current: Ready and neither of the others.
Reconciling and Stalled are never both True (kstatus would take whichever was written first)."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

READY = "Ready"
"""kstatus' summary condition: True when the resource does what it was asked to (`kubectl wait` reads it)."""
RECONCILING = "Reconciling"
"""kstatus' abnormal-true pair, shared by every kind: True while the operator is still working on it..."""
STALLED = "Stalled"
"""...and True while it cannot go on until a person changes something. Each kind adds its domain conditions:"""
DEGRADED = "Degraded"
"""ModelCache: something failed (a node's copy, the preload), whether or not it is usable; Stalled too unless
Reconciling (a node that is not Ready: it comes back or is deleted without a person)."""
CONFIG_VALID = "ConfigValid"
"""KVCacheTier: the spec passed the checks the API server cannot make, and its children were accepted."""
AVAILABLE = "Available"
"""KVCacheTier: at least one server is ready."""
ALL_INSTANCES_READY = "AllInstancesReady"
"""KVCacheTier: every selected node runs a ready server with the current configuration."""
L2_REACHABLE = "L2Reachable"
"""KVCacheTier: its L2 (claim, S3) is in use by ready servers."""
OFFLOAD_EFFECTIVE = "OffloadEffective"
"""KVCacheTier: over the last window, the recompute time hits saved exceeded what offloading cost (reasons Pays,
DoesNotPay, InsufficientData: True, False, Unknown)."""

CONDITION_TYPES = {
    "ModelCache": (READY, RECONCILING, STALLED, DEGRADED),
    "KVCacheTier": (
        CONFIG_VALID,
        AVAILABLE,
        ALL_INSTANCES_READY,
        L2_REACHABLE,
        READY,
        RECONCILING,
        STALLED,
        OFFLOAD_EFFECTIVE,
    ),
}
"""Each kind's conditions; a type an older operator wrote and no kind lists any more is dropped."""


@dataclass(frozen=True)
class Announced:
    """Which transitions of one condition are an Event, and of which type."""

    into_true_only: bool
    """Only a change into True is news (else every change of status or reason is)."""
    severity: Literal["Normal", "Warning", "WarningWhenFalse"]
    """WarningWhenFalse: a Warning while the condition is False, unless its reason is a step `IN_PROGRESS`."""
    warning_reasons: tuple[str, ...] = ()
    """Reasons that are a Warning whatever `severity` says (a server down because its node is)."""


IN_PROGRESS = ("RollingOut", "InstancesStarting")
"""Reasons of a rollout going as it should: Normal Events, never Warnings."""

EVENTS: Mapping[tuple[str, str], Announced] = {
    ("ModelCache", READY): Announced(into_true_only=True, severity="Normal"),
    ("ModelCache", DEGRADED): Announced(into_true_only=True, severity="Warning"),
    ("KVCacheTier", CONFIG_VALID): Announced(into_true_only=False, severity="WarningWhenFalse"),
    ("KVCacheTier", AVAILABLE): Announced(into_true_only=False, severity="WarningWhenFalse"),
    ("KVCacheTier", ALL_INSTANCES_READY): Announced(
        into_true_only=False, severity="Normal", warning_reasons=("NodeNotReady",)
    ),
    ("KVCacheTier", L2_REACHABLE): Announced(into_true_only=False, severity="WarningWhenFalse"),
    ("KVCacheTier", OFFLOAD_EFFECTIVE): Announced(into_true_only=False, severity="WarningWhenFalse"),
}
"""(kind, condition type) -> the Events its transitions emit; a condition not listed (a tier's Ready,
Reconciling and Stalled only restate the others) emits none."""


def transition_events(
    kind: str, previous: Sequence[Mapping[str, Any]], new: Sequence[Mapping[str, Any]]
) -> list[tuple[str, str, str]]:
    """(event type, reason, message) for each condition whose status or reason changed, as `EVENTS` says."""
    before = {c.get("type"): (c.get("status"), c.get("reason")) for c in previous}
    events = []
    for condition in new:
        rule = EVENTS.get((kind, condition["type"]))
        status, reason = condition["status"], condition["reason"]
        if rule is None or before.get(condition["type"]) == (status, reason):
            continue
        if rule.into_true_only and status != "True":
            continue
        warning = (
            rule.severity == "Warning"
            or reason in rule.warning_reasons
            or (rule.severity == "WarningWhenFalse" and status == "False" and reason not in IN_PROGRESS)
        )
        events.append(("Warning" if warning else "Normal", str(reason), str(condition.get("message", ""))))
    return events


def now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def set_condition(
    conditions: Iterable[Mapping[str, Any]],
    type_: str,
    status: bool | str,
    reason: str,
    message: str,
    *,
    generation: int | None,
    now: str | None = None,
) -> list[dict[str, Any]]:
    """Return a new condition list with `type_` set; other conditions are kept as they are."""
    status_text = status if isinstance(status, str) else ("True" if status else "False")
    result: list[dict[str, Any]] = []
    found = False
    for existing in conditions:
        if existing.get("type") != type_:
            result.append(dict(existing))
            continue
        found = True
        transition = existing.get("lastTransitionTime") if existing.get("status") == status_text else None
        result.append(_condition(type_, status_text, reason, message, generation, transition or now))
    if not found:
        result.append(_condition(type_, status_text, reason, message, generation, now))
    return result


def _condition(
    type_: str, status: str, reason: str, message: str, generation: int | None, when: str | None
) -> dict[str, Any]:
    condition: dict[str, Any] = {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": when or now_rfc3339(),
    }
    if generation is not None:
        condition["observedGeneration"] = generation
    return condition


def get_condition(conditions: Iterable[Mapping[str, Any]], type_: str) -> Mapping[str, Any] | None:
    return next((c for c in conditions if c.get("type") == type_), None)


def is_true(conditions: Iterable[Mapping[str, Any]], type_: str) -> bool:
    condition = get_condition(conditions, type_)
    return condition is not None and condition.get("status") == "True"
