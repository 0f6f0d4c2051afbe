"""One level-based reconcile of a KVCacheTier: the loop both kinds run (`handlers/controller.converge`), with the
tier's stops.

What differs from ModelCache's: the tier is read again first (a stale trigger cannot write a stale status) and
gathered once; a write's answer is folded into that observation (`plan.with_writes`) instead of reading again,
and only the token Secret asks for another plan (`Next.PLAN`: its uid is part of the children's configuration);
a refused child is a Problem of the settled plan; the KV namespace drops are actions like the children's, sent
to the servers by `io.execute`; a status-only reconcile (`full=False`) skips validation and the children. The
decisions are `resources/kvcachetier/plan.py`, the reads and writes `handlers/kvcachetier/io.py`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strata_operator import settings as strata_settings
from strata_operator.handlers import controller
from strata_operator.handlers.controller import Next
from strata_operator.handlers.kvcachetier import io
from strata_operator.handlers.kvcachetier.io import Applied, AppliedChildren
from strata_operator.handlers.process import runtime_of
from strata_operator.resources.core import Event, Problem
from strata_operator.resources.kvcachetier import plan as planning
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.observed import Observed
from strata_operator.resources.kvcachetier.plan import Plan
from strata_operator.resources.runtime_image import RuntimeImage

__all__ = ["Applied", "AppliedChildren", "Outcome", "reconcile"]

Results = tuple[io.Stored, Problem | None, io.Dropped]


@dataclass
class Outcome:
    """What one reconcile did (returned for the daemon, tests and the benchmark)."""

    applied: bool
    status_written: bool
    status: dict[str, Any]
    events: list[Event] = field(default_factory=list)


@dataclass
class TierRound:
    """The tier's stops of `controller.converge`, bound to one tier (as just read) for one reconcile."""

    body: Mapping[str, Any]
    runtime: RuntimeImage
    full: bool
    scrape: bool
    now: str | None = None
    consumers: int | None = None
    applied: AppliedChildren | None = None

    @property
    def previous(self) -> Mapping[str, Any]:
        return dict(self.body.get("status") or {})

    @property
    def tier(self) -> TierRef:
        return TierRef.from_body(self.body)

    def gather(self, more: bool) -> Observed:
        return io.gather(
            self.body, self.runtime, full=self.full, scrape=self.scrape, now=self.now, consumers=self.consumers
        )

    def plan(self, observed: Observed) -> Plan:
        return planning.plan(observed)

    def needs_more(self, plan: Plan) -> bool:
        return False

    def has_writes(self, plan: Plan) -> bool:
        return plan.has_writes

    def execute(self, plan: Plan) -> Results:
        return io.execute(plan, self.tier, self.applied)

    def settle(self, observed: Observed, plan: Plan, results: Results) -> tuple[Observed, Plan, Next]:
        observed = planning.with_writes(observed, *results)
        if plan.token_secret is not None:
            return observed, plan, Next.PLAN
        return observed, planning.settle(observed, plan), Next.DONE

    def write_status(self, patch: Mapping[str, Any]) -> None:
        io.write_status(self.tier, patch, self.body)


def reconcile(
    body: Mapping[str, Any],
    *,
    full: bool = True,
    now: str | None = None,
    settings: strata_settings.Settings | None = None,
    applied: AppliedChildren | None = None,
    scrape: bool = False,
    consumers: int | None = None,
) -> Outcome | None:
    """Reconcile the resource named in `body` (re-read, so a stale trigger cannot write a stale status).

    `settings`: the operator's (kopf's memo holds them); the process's own when called outside kopf.
    `applied`: where to record the versions our applies left, so their watch events can be told apart.
    `scrape`: read the servers' metrics into status.usage this time.
    `consumers`: the live pods naming the tier (None: unknown, status.consumers stays as stored).
    """
    meta = body["metadata"]
    current = io.read_tier(meta["name"], meta["namespace"])
    if current is None or current["metadata"].get("deletionTimestamp"):
        return None
    runtime = runtime_of(settings or strata_settings.current())
    kind = TierRound(current, runtime, full, scrape, now=now, consumers=consumers, applied=applied)
    done = controller.converge(kind)
    plan = done.plan
    applied_all = full and plan.checked.config_hash is not None
    return Outcome(applied=applied_all, status_written=done.status_written, status=plan.status, events=plan.events)
