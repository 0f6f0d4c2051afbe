"""One level-based reconcile of a KVCacheTier: gather → plan → execute → write status only if it changed (the
shape of ModelCache's `handlers/modelcache/reconcile.py`).

Level-based: every trigger (the resource itself, a child's event, the resync) wakes the tier's daemon
(`handlers/controller.py`), which runs this same code, so reconciles of one tier never overlap and converge on
the same state. The decisions are all in `resources/kvcachetier/plan.py`; this module carries them out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strata_operator import settings as strata_settings
from strata_operator.handlers.kvcachetier import io, namespaces
from strata_operator.handlers.kvcachetier.io import Applied, AppliedChildren
from strata_operator.handlers.process import runtime_of
from strata_operator.resources.core import Event, status_patch
from strata_operator.resources.kvcachetier import plan as planning

ROUNDS = 2
"""Writes per reconcile at most: the token Secret (only when it is missing), then the children."""

__all__ = ["Applied", "AppliedChildren", "Outcome", "reconcile"]


@dataclass
class Outcome:
    """What one reconcile did (returned for the daemon, tests and the benchmark)."""

    applied: bool
    status_written: bool
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)


def reconcile(
    body: Mapping[str, Any],
    *,
    full: bool = True,
    now: str | None = None,
    settings: strata_settings.Settings | None = None,
    applied: AppliedChildren | None = None,
    scrape: bool = False,
) -> Outcome | None:
    """Reconcile the resource named in `body` (re-read, so a stale trigger cannot write a stale status).

    `settings`: the operator's (kopf's memo holds them); the process's own when called outside kopf.
    `applied`: where to record the versions our applies left, so their watch events can be told apart.
    `scrape`: read the servers' metrics into status.usage this time.
    """
    meta = body["metadata"]
    current = io.read_tier(meta["name"], meta["namespace"])
    if current is None or current["metadata"].get("deletionTimestamp"):
        return None
    runtime = runtime_of(settings or strata_settings.current())
    observed = io.gather(current, runtime, full=full, scrape=scrape, now=now)
    plan = planning.plan(observed)
    for _ in range(ROUNDS):
        if not plan.actions and plan.token_secret is None:
            break
        stored, rejected = io.execute(plan, observed.tier, applied)
        observed = planning.with_writes(observed, stored, rejected)
        plan = planning.plan(observed) if plan.token_secret is not None else planning.settle(observed, plan)
    collected: list[Event] = []
    if observed.spec is not None:
        fields, collected = namespaces.step(observed.spec, observed.tier, observed.previous, observed.pods, now)
        plan.status.update(fields)
    patch = status_patch(observed.previous, plan.status)
    if patch is not None:
        io.write_status(observed.tier, patch)
    events = (plan.events if patch is not None else []) + collected
    done = full and plan.checked.config_hash is not None
    return Outcome(applied=done, status_written=patch is not None, status=plan.status, events=events)
