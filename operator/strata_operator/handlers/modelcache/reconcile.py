"""One level-based reconcile of a ModelCache: the loop both kinds run (`handlers/controller.converge`), with
ModelCache's stops.

What differs from the tier's: every round gathers afresh (a plan that creates a SharedPVC claim names its
preload Job after the claim's uid, so it asks for `Next.GATHER`), but for the capture sidecars' logs, read once
per reconcile (`CacheRound.capture_logs`); a plan may ask for more reads before it is carried out
(`needs_inputs`: the references a new Job would use, NodeLocal's capacity), and is then discarded unexecuted; a
write the API server refuses is reported by planning once more with the refusal, never retried in the same
reconcile; and a plan may ask the daemon for another reconcile right after (`wake_again`). The
decisions are `resources/modelcache/plan.py`, the reads and writes `handlers/modelcache/io.py`.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from strata_operator.handlers import controller
from strata_operator.handlers.controller import Next
from strata_operator.handlers.modelcache import io
from strata_operator.handlers.modelcache.node_cache import NodeCache
from strata_operator.resources.core import Event
from strata_operator.resources.modelcache import plan as planning
from strata_operator.resources.modelcache.compile_cache import CaptureLogs
from strata_operator.resources.modelcache.draft import Plan
from strata_operator.resources.modelcache.observed import Observed
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.runtime_image import RuntimeImage

Rejected = dict[tuple[str, str], str]


@dataclass
class CacheRound:
    """ModelCache's stops of `controller.converge`, bound to one cache for one reconcile."""

    body: Mapping[str, Any]
    previous: Mapping[str, Any]
    nodes: NodeCache
    runtime: RuntimeImage
    now: datetime.datetime | None = None
    consumers: int | None = None
    events: list[Event] = field(default_factory=list)
    """The Events of the writes carried out, in order."""
    capture_logs: CaptureLogs | None = None
    """The capture sidecars' logs as this reconcile's first gather read them, reused by the later ones: each read
    is a request the API server passes on to a kubelet, and a plan that asks for more reads (or gathers again to
    see a claim it created) needs nothing new from the logs."""

    @property
    def owner(self) -> CacheRef:
        return CacheRef.from_body(self.body)

    def gather(self, more: bool) -> Observed:
        observed = io.gather(
            self.body,
            self.previous,
            self.nodes,
            self.runtime,
            inputs=more,
            now=self.now,
            consumers=self.consumers,
            capture_logs=self.capture_logs,
        )
        self.capture_logs = observed.capture_logs
        return observed

    def plan(self, observed: Observed) -> Plan:
        return planning.plan(observed)

    def needs_more(self, plan: Plan) -> bool:
        return plan.needs_inputs

    def has_writes(self, plan: Plan) -> bool:
        return bool(plan.actions or plan.labels or plan.token_secret)

    def execute(self, plan: Plan) -> Rejected:
        return io.execute(plan, self.owner, self.nodes, self.events)

    def settle(self, observed: Observed, plan: Plan, results: Rejected) -> tuple[Observed, Plan, Next]:
        if results:  # say why in status; the refused writes are not planned again in this reconcile
            observed = planning.with_rejections(observed, results)
            return observed, planning.plan(observed), Next.DONE
        return observed, plan, Next.GATHER if plan.again else Next.DONE

    def write_status(self, patch: Mapping[str, Any]) -> None:
        io.write_status(self.owner, patch)


def reconcile(
    body: Mapping[str, Any],
    previous: Mapping[str, Any],
    nodes: NodeCache,
    runtime: RuntimeImage,
    *,
    now: datetime.datetime | None = None,
    wake: Callable[[], None] | None = None,
    recheck: Callable[[float], None] | None = None,
    consumers: int | None = None,
) -> tuple[dict[str, Any], list[Event]]:
    """Returns (the status now stored, Events to post). `previous` is the status last seen or written; `wake`
    asks the daemon for another reconcile right after this one (when the plan says so), `recheck` for one after
    so many seconds; `consumers`: the live pods naming the cache (None: unknown, status.consumers stays as
    stored)."""
    kind = CacheRound(body, previous, nodes, runtime, now=now, consumers=consumers)
    plan = controller.converge(kind).plan
    if plan.wake_again and wake is not None:
        wake()
    if plan.recheck_seconds is not None and recheck is not None:
        recheck(plan.recheck_seconds)
    return plan.status, kind.events + plan.events
