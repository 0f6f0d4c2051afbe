"""A Job that vanishes before its result is read is not created again at once: with
`preload.ttlSecondsAfterFinished: 0` that made a hot loop (306 Jobs in 110 s over 3 nodes)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from strata_operator import kube
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.handlers import modelcache_pernode as pernode
from strata_operator.handlers.modelcache_io import Context
from strata_operator.handlers.modelcache_nodes import NodeInfo
from strata_operator.resources.modelcache import storage
from strata_operator.resources.modelcache.owner import Owner

OWNER = Owner(name="llama", namespace="serving", uid="uid-1", generation=1)
NODES = {n: NodeInfo(n, f"uid-{n}", True) for n in ("gpu-a", "gpu-b", "gpu-c")}
SPEC = ModelCacheSpec.model_validate(
    {
        "source": {"uri": "hf://org/model"},
        "storage": {"mode": "NodeLocal"},
        "preload": {"ttlSecondsAfterFinished": 0},
    }
)


class Clock:
    def __init__(self) -> None:
        self.now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)

    def __call__(self) -> datetime.datetime:
        return self.now


@pytest.fixture
def world(monkeypatch: pytest.MonkeyPatch) -> tuple[Clock, list[str]]:
    """Jobs vanish as soon as they are created (a TTL of 0 racing the operator's read)."""
    clock, created = Clock(), []
    monkeypatch.setattr(pernode, "_now", clock, raising=False)
    monkeypatch.setattr(pernode, "list_children", lambda *_a: [])
    monkeypatch.setattr(pernode, "delete_job", lambda *_a: True)
    monkeypatch.setattr(kube, "apply", lambda body, **_: created.append(body["metadata"]["name"]))
    return clock, created


def reconcile_once(previous: dict[str, Any]) -> dict[str, Any]:
    ctx = Context({}, OWNER, SPEC, previous, _checked=True)
    states = pernode.node_states(
        ctx, storage.ROLE_PRELOAD, NODES, lambda n, uid: storage.node_preload(OWNER, SPEC, n, uid)
    )
    return {"nodes": states}


def test_vanishing_jobs_are_recreated_with_backoff_not_in_a_loop(world: tuple[Clock, list[str]]) -> None:
    clock, created = world
    status: dict[str, Any] = {}
    for _ in range(110):  # a reconcile a second for 110 s, as the watch events would drive it
        status = reconcile_once(status)
        clock.now += datetime.timedelta(seconds=1)
    # Created at 0 s, again at 31 s (30 s after it vanished) and at 92 s (60 s more): 3 per node, not 110;
    # the third vanishing waits 120 s.
    assert len(created) == 3 * len(NODES)
    assert {s["recreations"] for s in status["nodes"]} == {3}
    assert all("vanished before its result was read" in s["message"] for s in status["nodes"])


def test_backoff_doubles_and_is_bounded(world: tuple[Clock, list[str]]) -> None:
    clock, created = world
    status = reconcile_once({})
    delays = []
    for _ in range(12):
        status = reconcile_once(status)  # the Job is gone: schedule the next try
        node = status["nodes"][0]
        retry = datetime.datetime.strptime(node["retryAfter"], pernode.TIME_FORMAT).replace(tzinfo=datetime.UTC)
        delays.append(int((retry - clock.now).total_seconds()))
        clock.now = retry
        status = reconcile_once(status)  # due: created again
    assert delays[:4] == [30, 60, 120, 240] and max(delays) == pernode.RECREATE_MAX_SECONDS
    assert len(created) == 13 * len(NODES)


def test_a_new_request_is_created_at_once(world: tuple[Clock, list[str]]) -> None:
    _, created = world
    reconcile_once({"nodes": [{"name": "gpu-a", "job": "llama-preload-old", "phase": "Preloading"}]})
    assert len(created) == len(NODES)


def test_job_ttl_is_bounded_from_below() -> None:
    _, job = storage.node_preload(OWNER, SPEC, "gpu-a", "uid-gpu-a")
    assert job["spec"]["ttlSecondsAfterFinished"] == 60
    _, job = storage.node_preload(
        OWNER, ModelCacheSpec.model_validate({**SPEC.model_dump(by_alias=True), "preload": {}}), "gpu-a", "u"
    )
    assert job["spec"]["ttlSecondsAfterFinished"] == 86400
