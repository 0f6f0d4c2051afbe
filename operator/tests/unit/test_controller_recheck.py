"""The daemon loop's recheck (`controller.run_daemon`): a reconcile that asks to run again in a few seconds (a
compile capture awaited: its sidecar's log, which no watch sees, will say how it ended) gets a status refresh
then, without any wake-up and long before the resync; a reconcile that does not ask waits for a wake-up."""

from __future__ import annotations

import asyncio
import logging
import threading
from typing import Any

import pytest
from kopf._cogs.aiokits.aioenums import FlagSetter
from kopf._core.intents.stoppers import DaemonStoppingReason
from strata_operator.handlers import controller

RESYNC_SECONDS = 3600.0
"""Far beyond the test's wait: a second reconcile can only come from the recheck."""
BODY = {"metadata": {"namespace": "ns", "name": "cache"}}


async def run(rechecks: list[float | None], wanted: int, wait_seconds: float) -> list[bool]:
    """Runs the daemon until `wanted` reconciles happened (or the wait is over); the n-th reconcile asks for a
    recheck in `rechecks[n]` seconds. Returns each reconcile's `full`."""
    memory = controller.Memory(name="test")
    setter: FlagSetter[DaemonStoppingReason] = FlagSetter()
    seen: list[bool] = []
    enough = threading.Event()

    def reconcile(_snapshot: dict[str, Any], waker: controller.Waker, full: bool) -> list[tuple[str, str, str]]:
        seen.append(full)
        if len(seen) <= len(rechecks) and (seconds := rechecks[len(seen) - 1]) is not None:
            waker.recheck_in(seconds)
        if len(seen) >= wanted:
            enough.set()
        return []

    daemon = asyncio.create_task(
        controller.run_daemon(
            memory,
            BODY,  # type: ignore[arg-type]
            setter.async_waiter,  # what kopf gives an async daemon
            logging.getLogger("test"),  # type: ignore[arg-type]
            reconcile,
            resync_seconds=RESYNC_SECONDS,
        )
    )
    await asyncio.get_running_loop().run_in_executor(None, enough.wait, wait_seconds)
    setter.set(DaemonStoppingReason.RESOURCE_DELETED)
    await asyncio.wait_for(daemon, timeout=30)
    memory.executor.shutdown()
    return seen


def test_a_reconcile_that_asks_for_a_recheck_runs_again_as_a_status_refresh_without_a_wake_up() -> None:
    seen = asyncio.run(run([0.2, 0.2, None], wanted=3, wait_seconds=60))
    assert seen == [True, False, False]  # the first is full; the rechecks refresh the status only


def test_without_a_recheck_the_daemon_waits_for_a_wake_up() -> None:
    seen = asyncio.run(run([None], wanted=2, wait_seconds=2))
    assert seen == [True]


@pytest.mark.parametrize("asked", [[5.0, 0.2], [0.2, 5.0]])
def test_the_soonest_recheck_asked_in_a_reconcile_wins(asked: list[float]) -> None:
    waker = controller.Waker()
    for seconds in asked:
        waker.recheck_in(seconds)
    assert waker.recheck == 0.2
    waker.take()
    assert waker.recheck is None  # each reconcile asks afresh
