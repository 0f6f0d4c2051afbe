"""Strata never takes over an object it did not create: a same-named object someone else made is a NameConflict,
not something to apply over (forced apply would make the CR its controller, and its deletion would delete it)."""

from __future__ import annotations

import datetime
from typing import Any

import pytest
from strata_operator import kube
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.kvcachetier.children import build_children
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.observed import Observed as TierObserved
from strata_operator.resources.kvcachetier.plan import plan as tier_plan
from strata_operator.resources.modelcache.draft import Plan
from strata_operator.resources.modelcache.observed import Observed
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.plan import plan
from strata_operator.resources.runtime_image import RuntimeImage

OWNER = CacheRef(name="llama", namespace="serving", uid="uid-1", generation=1)
TIER = TierRef(name="kv", namespace="serving", uid="tier-uid", generation=1)
RUNTIME = RuntimeImage("registry.local/strata-runtime:test")


def stored(body: dict[str, Any]) -> dict[str, Any]:
    """The object as the API server would return it from an apply."""
    return {**body, "metadata": {**body["metadata"], "uid": "new-uid", "resourceVersion": "1"}}


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def fake_apply(body: dict[str, Any], **_: Any) -> dict[str, Any]:
        calls.append(body)
        return stored(body)

    monkeypatch.setattr(kube, "apply", fake_apply)
    return calls


def user_object(kind: str, name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "serving", "uid": "u", **meta}}


NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def shared_observed(claim: dict[str, Any] | None, **shared: Any) -> Observed:
    spec = ModelCacheSpec.model_validate(
        {
            "source": {"uri": "s3://models/llama"},
            "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "10Gi", **shared}},
        }
    )
    return Observed(owner=OWNER, previous={}, now=NOW, spec=spec, claim=claim, inputs_checked=True)


def ready_condition(status: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in status["conditions"] if c["type"] == "Ready")


def applied_kinds(result: Plan) -> list[str]:
    return [a.body["kind"] for a in result.actions if a.verb == "apply"]


def test_a_users_claim_under_the_default_name_is_a_name_conflict() -> None:
    theirs = user_object("PersistentVolumeClaim", "llama-model", labels={"team": "data"})
    result = plan(shared_observed(theirs))
    assert result.actions == []
    ready = ready_condition(result.status)
    assert ready["reason"] == "NameConflict"
    assert "PersistentVolumeClaim 'llama-model'" in ready["message"] and "claimName: llama-model" in ready["message"]


def test_the_conflict_shows_as_ready_false_and_a_warning() -> None:
    result = plan(shared_observed(user_object("PersistentVolumeClaim", "llama-model")))
    ready = ready_condition(result.status)
    assert (ready["status"], ready["reason"]) == ("False", "NameConflict")
    assert ("Warning", "NameConflict") in [(t, r) for t, r, _ in result.events]
    assert result.actions == []


def test_our_own_claim_is_still_repaired() -> None:
    """Made by this cache (its ownerReference), or kept by Retain (our labels, no ownerReference)."""
    for meta in (
        {"ownerReferences": [OWNER.reference()]},
        {"labels": OWNER.labels("model")},
    ):
        ours = user_object("PersistentVolumeClaim", "llama-model", **meta)
        ours["spec"] = {"resources": {"requests": {"storage": "1Gi"}}}
        result = plan(shared_observed(ours))
        assert ready_condition(result.status)["reason"] != "NameConflict"
        assert applied_kinds(result).count("PersistentVolumeClaim") == 1


def test_claim_name_adopts_on_purpose() -> None:
    theirs = user_object("PersistentVolumeClaim", "data")
    observed = shared_observed(theirs, claimName="data")
    assert observed.spec is not None
    observed.spec.storage.shared_pvc.size = None  # type: ignore[union-attr]
    result = plan(observed)
    assert ready_condition(result.status)["reason"] != "NameConflict"
    assert "PersistentVolumeClaim" not in applied_kinds(result) and result.status["claimName"] == "data"


def tier_spec() -> KVCacheTierSpec:
    return KVCacheTierSpec.model_validate({})


def tier_observed(live: dict[tuple[str, str], dict[str, Any] | None]) -> TierObserved:
    spec = KVCacheTierSpec.model_validate({"auth": {"disabled": True}})
    return TierObserved(TIER, runtime=RUNTIME, spec=spec, live=live)


def test_a_users_config_map_named_like_the_tiers_is_a_name_conflict() -> None:
    theirs = user_object("ConfigMap", "kv-config", labels={"app": "mine"})
    result = tier_plan(tier_observed({("ConfigMap", "kv-config"): theirs}))
    valid = next(c for c in result.status["conditions"] if c["type"] == "ConfigValid")
    assert (valid["status"], valid["reason"]) == ("False", "NameConflict")
    assert "ConfigMap 'kv-config'" in valid["message"]
    assert result.actions == [], "nothing is applied while any child's name is taken"


def test_the_tiers_own_children_are_applied() -> None:
    children = build_children(KVCacheTierSpec.model_validate({"auth": {"disabled": True}}), TIER, RUNTIME)
    ours = {(c["kind"], c["metadata"]["name"]): stored(c) for c in children.in_apply_order()}
    result = tier_plan(tier_observed(ours))
    assert [a.body for a in result.actions] == children.in_apply_order()


def test_a_users_secret_under_the_generated_token_name_is_a_name_conflict() -> None:
    theirs = user_object("Secret", "kv-kv-token")
    spec = KVCacheTierSpec.model_validate({})
    result = tier_plan(TierObserved(TIER, runtime=RUNTIME, spec=spec, live={("Secret", "kv-kv-token"): theirs}))
    valid = next(c for c in result.status["conditions"] if c["type"] == "ConfigValid")
    assert valid["reason"] == "NameConflict" and "auth.secretRef" in valid["message"]
    assert result.actions == [] and result.token_secret is None
