"""Set Kubernetes-style conditions: lastTransitionTime moves only when the status flips."""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from typing import Any

READY = "Ready"
"""kstatus' summary condition: True when the resource does what it was asked to (`kubectl wait` reads it)."""
RECONCILING = "Reconciling"
"""kstatus' abnormal-true pair, shared by every kind: True while the operator is still working on it..."""
STALLED = "Stalled"
"""...and True while it cannot go on until a person changes something. Each kind adds its domain conditions."""


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
