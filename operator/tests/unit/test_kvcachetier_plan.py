"""A KVCacheTier reconcile's decisions on plain data: the token first, then the children and the KV namespace
drops, then the status of what the writes and the servers' answers left (the loop both kinds run)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from pydantic import ValidationError
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.core import Problem, invalid_spec
from strata_operator.resources.kvcachetier import namespaces as ns
from strata_operator.resources.kvcachetier.children import build_children, child_names
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.observed import Observed
from strata_operator.resources.kvcachetier.plan import plan, settle, with_writes
from strata_operator.resources.runtime_image import RuntimeImage

TIER = TierRef(name="kv", namespace="serving", uid="tier-uid", generation=3)
RUNTIME = RuntimeImage("registry.local/strata-runtime:test")


def stored(body: dict[str, Any], uid: str = "u-1", **status: Any) -> dict[str, Any]:
    meta = {**body["metadata"], "uid": uid, "resourceVersion": "7", "generation": 1}
    return {**body, "metadata": meta, **({"status": status} if status else {})}


def condition(status: dict[str, Any], type_: str) -> tuple[str, str]:
    found = next(c for c in status["conditions"] if c["type"] == type_)
    return found["status"], found["reason"]


def test_a_generated_token_is_ensured_before_any_child_is_planned() -> None:
    first = plan(Observed(TIER, runtime=RUNTIME, spec=KVCacheTierSpec()))
    assert first.actions == [] and first.token_secret is not None
    assert first.token_secret.name == "kv-kv-token" and first.token_secret.secret("t")["immutable"] is True
    secret = stored(first.token_secret.secret("t"), uid="secret-uid")
    second = plan(
        with_writes(Observed(TIER, runtime=RUNTIME, spec=KVCacheTierSpec()), {("Secret", "kv-kv-token"): secret}, None)
    )
    assert second.token_secret is None and [a.key[0] for a in second.actions][-1] == "DaemonSet"
    expected = build_children(KVCacheTierSpec(), TIER, RUNTIME, token_version="secret-uid").in_apply_order()
    assert [a.body for a in second.actions] == expected, "the token's uid is part of the configuration"


def test_after_its_writes_the_plan_has_nothing_left_and_reports_on_what_was_stored() -> None:
    spec = KVCacheTierSpec.model_validate({"auth": {"disabled": True}})
    observed = Observed(TIER, runtime=RUNTIME, spec=spec)
    first = plan(observed)
    written = {a.key: stored(dict(a.body)) for a in first.actions}
    daemonset_key = ("DaemonSet", "kv")
    written[daemonset_key] = stored(
        dict(written[daemonset_key]),
        desiredNumberScheduled=2,
        numberReady=2,
        updatedNumberScheduled=2,
        observedGeneration=1,
    )
    final = settle(with_writes(observed, written, None), first)
    assert final.actions == [] and final.checked.config_hash == first.checked.config_hash
    assert final.status["configHash"] == first.checked.config_hash and final.status["readyInstances"] == 2
    assert condition(final.status, "Ready") == ("True", "AllReady")


def test_a_child_the_api_server_refused_is_the_config_problem() -> None:
    spec = KVCacheTierSpec.model_validate({"auth": {"disabled": True}})
    refused = Problem("ChildRejected", "the API server refused DaemonSet kv: bad affinity")
    observed = Observed(TIER, runtime=RUNTIME, spec=spec)
    result = settle(with_writes(observed, {}, refused), plan(observed))
    assert result.actions == [] and result.checked.config_hash is None
    assert plan(with_writes(observed, {}, refused)).actions == [], "a refusal is not retried within the reconcile"
    assert condition(result.status, "ConfigValid") == ("False", "ChildRejected")
    assert ("Warning", "ChildRejected", refused.message) in result.events


def test_a_status_refresh_plans_no_write_and_keeps_what_it_did_not_look_at() -> None:
    previous = {"configHash": "abc", "usage": {"lookups": 3}, "consumers": 2}
    result = plan(Observed(TIER, previous=previous, runtime=RUNTIME, spec=KVCacheTierSpec(), full=False))
    assert result.actions == [] and result.token_secret is None
    assert result.status["configHash"] == "abc" and result.status["usage"] == {"lookups": 3}


def test_a_refused_spec_only_says_so_in_config_valid() -> None:
    with pytest.raises(ValidationError) as error:
        KVCacheTierSpec.model_validate({"port": 0})
    previous = {"readyInstances": 2, "endpoints": [{"node": "n1"}]}
    result = plan(Observed(TIER, previous=previous, spec_problem=invalid_spec(error.value)))
    assert result.actions == [] and result.status["readyInstances"] == 2
    assert condition(result.status, "ConfigValid") == ("False", "InvalidSpec")
    assert [(t, r) for t, r, _ in result.events] == [("Warning", "InvalidSpec")]


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"auth": {"disabled": True}},
        {"l2": {"fs": {"pvc": {"create": {"size": "1Ti"}}}}},
        {"l2": {"fs": {"pvc": {"claimName": "theirs"}}}, "auth": {"secretRef": {"name": "mine"}}},
    ],
)
def test_gather_reads_exactly_the_names_the_tier_creates(fields: dict[str, Any]) -> None:
    spec = KVCacheTierSpec.model_validate(fields)
    built = {(c["kind"], c["metadata"]["name"]) for c in build_children(spec, TIER, RUNTIME).in_apply_order()}
    token = {("Secret", "kv-kv-token")} if not fields.get("auth") else set()
    assert {(kind, name) for _, kind, name in child_names(spec, TIER)} == built | token


OLD = "a1a1a1a1a1a1"
MODEL = f"/models/llama/rev-{OLD}"
NAMESPACE = f"_models_llama_rev-{OLD}_0123456789ab"
KEY = ("llama", OLD, MODEL)
IDLE = {"namespaces": [{"modelCache": "llama", "revision": OLD, "model": MODEL, "idleSince": "2026-01-01T00:00:00Z"}]}
LATER = "2026-01-01T02:00:00Z"


def server(name: str, ip: str | None) -> dict[str, Any]:
    ready = {"type": "Ready", "status": "True" if ip else "False"}
    return {"metadata": {"name": name}, "status": {"podIP": ip or "10.0.0.9", "conditions": [ready]}}


def test_an_idle_old_revision_is_dropped_from_every_server_as_an_action_of_the_plan() -> None:
    """The cache moved on (its revision is b2…), no wired pod serves a1…, the grace period passed: one drop."""
    spec = KVCacheTierSpec.model_validate({"auth": {"secretRef": {"name": "kv-token"}}})
    observed = Observed(
        TIER,
        previous=IDLE,
        now=LATER,
        runtime=RUNTIME,
        spec=spec,
        full=False,
        pods=[server("kv-a", "10.0.0.1"), server("kv-b", None)],
        revisions={"llama": frozenset(["b2b2b2b2b2b2"])},
    )
    result = plan(observed)
    assert result.drops == [
        ns.Drop(KEY, MODEL, (("kv-a", "10.0.0.1"), ("kv-b", None)), spec.port, ("kv-token", "token"))
    ]
    assert result.has_writes and result.status["namespaces"] == [{**IDLE["namespaces"][0], "servingPods": 0}]
    kept = replace(observed, revisions={"llama": frozenset([OLD])})
    assert plan(kept).drops == [], "the cache's current revision is kept"


def test_drops_wait_for_the_token_secret_the_servers_need() -> None:
    observed = Observed(TIER, previous=IDLE, now=LATER, runtime=RUNTIME, spec=KVCacheTierSpec())
    first = plan(observed)
    assert first.token_secret is not None and first.drops == []
    secret = stored(first.token_secret.secret("t"), uid="secret-uid")
    second = plan(with_writes(observed, {("Secret", "kv-kv-token"): secret}, None))
    assert [d.key for d in second.drops] == [KEY] and second.drops[0].servers == (("(no server)", None),)


def test_settling_folds_the_servers_answers_into_status_and_events() -> None:
    spec = KVCacheTierSpec.model_validate({"auth": {"disabled": True}})
    observed = Observed(TIER, previous=IDLE, now=LATER, runtime=RUNTIME, spec=spec, full=False)
    planned = plan(observed)
    assert planned.drops[0].token is None
    answers = {KEY: [ns.ServerDrops("kv-a", {NAMESPACE: (3, 300)}), ns.ServerDrops("kv-b", {NAMESPACE: (1, 100)})]}
    done = settle(with_writes(observed, {}, None, answers), planned)
    assert done.drops == [] and "namespaces" not in done.status
    assert done.status["collectedNamespaces"][0]["freedBytes"] == 400
    assert [(t, r) for t, r, _ in done.events][-1] == ("Normal", "NamespaceCollected")
    missed = {KEY: [ns.ServerDrops("kv-a", error="not ready")]}
    pending = settle(with_writes(observed, {}, None, missed), planned)
    assert "kv-a: not ready" in pending.status["namespaces"][0]["pending"]


def test_consumers_come_from_the_daemons_count_and_an_unknown_count_keeps_the_stored_one() -> None:
    """status.consumers has one writer, the reconcile: the plan puts the count the daemon's pod index gave."""
    spec = KVCacheTierSpec()
    counted = plan(Observed(TIER, previous={"consumers": 2}, runtime=RUNTIME, spec=spec, full=False, consumers=5))
    assert counted.status["consumers"] == 5
    unknown = plan(Observed(TIER, previous={"consumers": 2}, runtime=RUNTIME, spec=spec, full=False))
    assert unknown.status["consumers"] == 2
    refused = plan(Observed(TIER, previous={"consumers": 2}, spec_problem=Problem("InvalidSpec", "x"), consumers=0))
    assert refused.status["consumers"] == 0
