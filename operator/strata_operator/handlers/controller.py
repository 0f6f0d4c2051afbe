"""What both controllers share: one kopf daemon per object, and the one loop its reconcile runs.

The loop (`converge`): gather → plan → execute → settle, then write the status only if it changed. `gather` and
`execute` are the kind's `io.py` (the only modules that talk to the API server or a server), `plan` and `settle`
are pure (`resources/<kind>/plan.py`). Rounds: a plan that asks for more reads (`needs_more`) is discarded and
planned again after a gather with them; after an execute, `settle` says whether the plan is final (`Next.DONE`),
must be made again from the observation with the writes folded in (`Next.PLAN`), or from a fresh gather
(`Next.GATHER`). At most `ROUNDS` plans per reconcile; when the rounds run out, the last plan executed stands and
the next reconcile (woken by the writes' own watch events, or the resync) goes on from there.

Watches on the object, its children and nodes never reconcile themselves: they `wake` the object's daemon, so
a burst of events (a pod finishing: pod, Job, Job again) collapses into one reconcile, reconciles of one object
never overlap, and a periodic resync repairs whatever no watch reported. A failed reconcile backs off, but a
wake-up (a fixed spec, a child changing) ends the wait at once.

Each daemon also reads its object's live consumer pods from a kopf index (`consumer_index`: pods that name a
cache or tier in their opt-in label) and passes the count to its reconcile, whose plan puts it in
status.consumers; a consumer pod's event wakes the daemon only when the count moved (`consumers_moved`).

What a controller keeps between events (its wakers, the threads its blocking reconciles run on, anything else
it needs) lives in a `Memory` on kopf's operator memo, made at startup: no module holds state, and every
operator run (and every test) has its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import copy
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import kopf

from strata_operator.resources.core import KV_TIER_LABEL, MODEL_CACHE_LABEL, status_patch

DEBOUNCE_SECONDS = 0.5
"""After a wake-up, wait this long for the rest of the burst before reconciling."""
ERROR_WARNINGS_AT = (1, 5, 20)
"""Consecutive failures after which a Warning Event says so (the log has every one)."""
MAX_BACKOFF_SECONDS = 60.0
ENDED = ("Succeeded", "Failed")
"""Pod phases that no longer count as a consumer."""
ROUNDS = 3
"""Plans one reconcile makes at most: ModelCache's asks once for the Job references and once to see a claim it
created; the tier's once to create its token Secret."""


class Waker:
    """Wakes one object's daemon. `full` asks for a full reconcile (children re-applied) rather than a status
    refresh; `tags` are whatever a controller records to decide which watch events concern the object."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.full = True
        self.tags: dict[str, Any] = {}
        self.recheck: float | None = None
        """Seconds after which the reconcile asked to run again (a status refresh), sooner than the resync."""

    def wake(self, *, full: bool = True) -> None:
        self.full = self.full or full
        self.event.set()

    def recheck_in(self, seconds: float) -> None:
        """Called from the reconcile's thread: a plain assignment, read by the daemon once the reconcile is done."""
        self.recheck = seconds if self.recheck is None else min(self.recheck, seconds)

    def take(self) -> bool:
        """Clear the wake-up before a reconcile; returns whether it must be a full one."""
        full, self.full = self.full, False
        self.event.clear()
        self.recheck = None
        return full


@dataclass
class Memory:
    """One controller's state between events; see the module docstring."""

    name: str
    wakers: dict[tuple[str, str], Waker] = field(default_factory=dict)
    executor: concurrent.futures.ThreadPoolExecutor = field(init=False)

    def __post_init__(self) -> None:
        self.executor = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix=self.name)

    def wake(self, namespace: str | None, name: str | None, *, full: bool = True) -> None:
        waker = self.wakers.get((namespace or "", name or ""))
        if waker is not None:
            waker.wake(full=full)


@dataclass(frozen=True)
class Consumed:
    """A kind pods opt into by a label, and the kopf index of its live consumers (handlers get it by `index`)."""

    kind: str
    label: str
    index: str

    @property
    def selector(self) -> dict[str, Any]:
        """The pods that opt in: any value of the label."""
        return {self.label: kopf.PRESENT}


MODEL_CACHES = Consumed("ModelCache", MODEL_CACHE_LABEL, "model_cache_consumers")
KV_TIERS = Consumed("KVCacheTier", KV_TIER_LABEL, "kv_tier_consumers")


def consumer_index(consumed: Consumed) -> Callable[..., dict[tuple[str, str], str] | None]:
    """The kopf index of `consumed`'s live consumer pods: (namespace, cache or tier) -> pod name."""

    def consumers(
        namespace: str | None, name: str, labels: Mapping[str, str], status: kopf.Status, meta: kopf.Meta, **_: Any
    ) -> dict[tuple[str, str], str] | None:
        if status.get("phase") in ENDED or meta.get("deletionTimestamp"):
            return None
        return {(namespace or "", labels[consumed.label]): name}

    return consumers


def count_consumers(index: kopf.Index[tuple[str, str], str], waker: Waker, key: tuple[str, str]) -> int:
    """The live consumers of `key` (namespace, name) now; remembered on the waker, so that a pod event that does
    not move the count wakes nobody (`consumers_moved`)."""
    count = len(index.get(key, []))
    waker.tags["consumers"] = count
    return count


def consumers_moved(index: kopf.Index[tuple[str, str], str], waker: Waker, key: tuple[str, str]) -> bool:
    """Whether the count differs from what the daemon's last reconcile read (kopf updates the index before the
    pod's event handlers run)."""
    return len(index.get(key, [])) != waker.tags.get("consumers")


async def run_daemon(
    memory: Memory,
    body: kopf.Body,
    stopped: kopf.DaemonStopped,
    logger: kopf.Logger,
    reconcile: Callable[[dict[str, Any], Waker, bool], list[tuple[str, str, str]]],
    *,
    resync_seconds: float,
) -> None:
    """Reconcile now, then on every wake-up or resync until the object goes. `reconcile(snapshot, waker, full)`
    runs in a worker thread on a copy of the object taken here (kopf updates `body` on its own loop) and returns
    the Events to post on the object."""
    meta = body["metadata"]
    key = (meta["namespace"], meta["name"])
    waker = memory.wakers.setdefault(key, Waker())
    loop = asyncio.get_running_loop()
    failures = 0
    try:
        while not stopped:
            full = waker.take()
            snapshot = copy.deepcopy(dict(body))
            # In the daemon's context, as kopf runs its sync handlers and asyncio.to_thread its functions: a bare
            # run_in_executor starts the thread's work in an empty context, losing what the daemon's task carries
            # (the tests' API-request recorder marks the operator's requests by a context variable).
            context = contextvars.copy_context()
            try:
                events = await loop.run_in_executor(memory.executor, context.run, reconcile, snapshot, waker, full)
            except Exception as error:  # an API hiccup must not end the daemon: back off and try again
                failures += 1
                waker.full = True
                logger.exception(f"reconcile failed (attempt {failures})")
                if failures in ERROR_WARNINGS_AT:
                    kopf.warn(body, reason="ReconcileError", message=f"{type(error).__name__}: {error}")
                await sleep(waker.event, stopped, backoff_seconds(failures))
                continue
            failures = 0
            for type_, reason, message in events:
                kopf.event(body, type=type_, reason=reason, message=message[:1024])
            timeout = min(resync_seconds, waker.recheck or resync_seconds)
            if await sleep(waker.event, stopped, timeout):
                await stopped.wait(DEBOUNCE_SECONDS)
            elif timeout == resync_seconds:
                waker.full = True  # a resync re-applies everything: it is the safety net for missed events
    finally:
        if memory.wakers.get(key) is waker:
            del memory.wakers[key]


def backoff_seconds(failures: int) -> float:
    """2 s doubling per consecutive failure, at most a minute: never a tight loop, never a long outage."""
    return float(min(MAX_BACKOFF_SECONDS, 2.0 ** min(failures, 16)))


async def sleep(event: asyncio.Event, stopped: kopf.DaemonStopped, timeout: float) -> bool:
    """Wait for a wake-up, the stop flag or the timeout; True when it was a wake-up."""
    waits = [asyncio.ensure_future(event.wait()), asyncio.ensure_future(stopped.wait())]
    try:
        await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in waits:
            task.cancel()
    return event.is_set()


# -- the loop ---------------------------------------------------------------------------------------------------
class Next(enum.Enum):
    """What follows an execute (`Kind.settle` says)."""

    DONE = "done"
    """The settled plan is final: its status is written."""
    PLAN = "plan"
    """Plan again from the observation with the writes folded in (the tier's new token Secret)."""
    GATHER = "gather"
    """Read everything again, then plan (a ModelCache claim just created names its preload Job)."""


class Planned(Protocol):
    status: dict[str, Any]


Obs = TypeVar("Obs")
PlanT = TypeVar("PlanT", bound=Planned)
Res = TypeVar("Res")


class Kind(Protocol[Obs, PlanT, Res]):
    """One kind's stops of the loop, bound to one object for one reconcile (`handlers/<kind>/reconcile.py`)."""

    @property
    def previous(self) -> Mapping[str, Any]:
        """The status as stored when the reconcile began: what `converge` compares the plan's status with."""

    def gather(self, more: bool) -> Obs: ...

    def plan(self, observed: Obs) -> PlanT: ...

    def needs_more(self, plan: PlanT) -> bool: ...

    def has_writes(self, plan: PlanT) -> bool: ...

    def execute(self, plan: PlanT) -> Res: ...

    def settle(self, observed: Obs, plan: PlanT, results: Res) -> tuple[Obs, PlanT, Next]: ...

    def write_status(self, patch: Mapping[str, Any]) -> None: ...


@dataclass
class Converged(Generic[PlanT]):
    plan: PlanT
    """The last plan: its status is what is stored now."""
    status_written: bool


def converge(kind: Kind[Obs, PlanT, Res]) -> Converged[PlanT]:
    """One reconcile of one object: the rounds of the module docstring, then the status if it changed."""
    more, step = False, Next.GATHER
    observed: Obs | None = None
    plan: PlanT | None = None
    for _ in range(ROUNDS):
        if step is Next.GATHER or observed is None:
            observed = kind.gather(more)
        plan = kind.plan(observed)
        if kind.needs_more(plan) and not more:
            more, step = True, Next.GATHER  # discarded unexecuted: planned again with the answer
            continue
        if not kind.has_writes(plan):
            break
        observed, plan, step = kind.settle(observed, plan, kind.execute(plan))
        if step is Next.DONE:
            break
    assert plan is not None  # ROUNDS >= 1
    patch = status_patch(kind.previous, plan.status)
    if patch is not None:
        kind.write_status(patch)
    return Converged(plan, patch is not None)
