"""How both controllers are triggered: one kopf daemon per object runs its level-based reconcile.

Watches on the object, its children and nodes never reconcile themselves: they `wake` the object's daemon, so
a burst of events (a pod finishing: pod, Job, Job again) collapses into one reconcile, reconciles of one object
never overlap, and a periodic resync repairs whatever no watch reported. A failed reconcile backs off, but a
wake-up (a fixed spec, a child changing) ends the wait at once.

What a controller keeps between events (its wakers, the threads its blocking reconciles run on, anything else
it needs) lives in a `Memory` on kopf's operator memo, made at startup: no module holds state, and every
operator run (and every test) has its own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import kopf

DEBOUNCE_SECONDS = 0.5
"""After a wake-up, wait this long for the rest of the burst before reconciling."""
ERROR_WARNINGS_AT = (1, 5, 20)
"""Consecutive failures after which a Warning Event says so (the log has every one)."""
MAX_BACKOFF_SECONDS = 60.0


class Waker:
    """Wakes one object's daemon. `full` asks for a full reconcile (children re-applied) rather than a status
    refresh; `tags` are whatever a controller records to decide which watch events concern the object."""

    def __init__(self) -> None:
        self.event = asyncio.Event()
        self.full = True
        self.tags: dict[str, Any] = {}

    def wake(self, *, full: bool = True) -> None:
        self.full = self.full or full
        self.event.set()

    def take(self) -> bool:
        """Clear the wake-up before a reconcile; returns whether it must be a full one."""
        full, self.full = self.full, False
        self.event.clear()
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
            try:
                events = await loop.run_in_executor(memory.executor, reconcile, snapshot, waker, full)
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
            if await sleep(waker.event, stopped, resync_seconds):
                await stopped.wait(DEBOUNCE_SECONDS)
            else:
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
