"""A Job that vanishes before its result is read is not created again at once: with
`preload.ttlSecondsAfterFinished: 0` that made a hot loop (306 Jobs in 110 s over 3 nodes)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

import pytest
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.modelcache import storage
from strata_operator.resources.modelcache.draft import RECREATE_MAX_SECONDS, TIME_FORMAT
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.observed import Observed
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.plan import plan

OWNER = CacheRef(name="llama", namespace="serving", uid="uid-1", generation=1)
NODES = {n: NodeInfo(n, f"uid-{n}", True) for n in ("gpu-a", "gpu-b", "gpu-c")}
SPEC = ModelCacheSpec.model_validate(
    {
        "source": {"uri": "hf://org/model"},
        "storage": {"mode": "NodeLocal", "nodeLocal": {"fanOut": {"enabled": False}}},
        "preload": {"ttlSecondsAfterFinished": 0},
    }
)


class Clock:
    def __init__(self) -> None:
        self.now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

    def __call__(self) -> datetime.datetime:
        return self.now


@dataclass
class World:
    """Jobs vanish as soon as they are created (a TTL of 0 racing the operator's read): every plan observes
    none, at the clock's time, and what it would create is counted."""

    clock: Clock = field(default_factory=Clock)
    created: list[str] = field(default_factory=list)

    def reconcile_once(self, previous: dict[str, Any]) -> dict[str, Any]:
        observed = Observed(
            owner=OWNER, previous=previous, now=self.clock(), spec=SPEC, nodes=NODES, inputs_checked=True
        )
        result = plan(observed)
        self.created += [a.key[1] for a in result.actions if a.verb == "apply"]
        return result.status


@pytest.fixture
def world() -> World:
    return World()


def test_vanishing_jobs_are_recreated_with_backoff_not_in_a_loop(world: World) -> None:
    clock, created = world.clock, world.created
    status: dict[str, Any] = {}
    for _ in range(110):  # a reconcile a second for 110 s, as the watch events would drive it
        status = world.reconcile_once(status)
        clock.now += datetime.timedelta(seconds=1)
    # Created at 0 s, again at 31 s (30 s after it vanished) and at 92 s (60 s more): 3 per node, not 110;
    # the third vanishing waits 120 s.
    assert len(created) == 3 * len(NODES)
    assert {s["recreations"] for s in status["nodes"]} == {3}
    assert all("vanished before its result was read" in s["message"] for s in status["nodes"])


def test_backoff_doubles_and_is_bounded(world: World) -> None:
    clock, created = world.clock, world.created
    status = world.reconcile_once({})
    delays = []
    for _ in range(12):
        status = world.reconcile_once(status)  # the Job is gone: schedule the next try
        node = status["nodes"][0]
        retry = datetime.datetime.strptime(node["retryAfter"], TIME_FORMAT).replace(tzinfo=datetime.UTC)
        delays.append(int((retry - clock.now).total_seconds()))
        clock.now = retry
        status = world.reconcile_once(status)  # due: created again
    assert delays[:4] == [30, 60, 120, 240] and max(delays) == RECREATE_MAX_SECONDS
    assert len(created) == 13 * len(NODES)


def test_a_new_request_is_created_at_once(world: World) -> None:
    world.reconcile_once({"nodes": [{"name": "gpu-a", "job": "llama-preload-old", "phase": "Preloading"}]})
    assert len(world.created) == len(NODES)


def test_job_ttl_is_bounded_from_below() -> None:
    _, job = storage.node_preload(OWNER, SPEC, "gpu-a", "uid-gpu-a")
    assert job["spec"]["ttlSecondsAfterFinished"] == 60
    _, job = storage.node_preload(
        OWNER, ModelCacheSpec.model_validate({**SPEC.model_dump(by_alias=True), "preload": {}}), "gpu-a", "u"
    )
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400
