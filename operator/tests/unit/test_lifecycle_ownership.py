"""Strata never takes over an object it did not create: a same-named object someone else made is a NameConflict,
not something to apply over (forced apply would make the CR its controller, and its deletion would delete it)."""

from __future__ import annotations

from typing import Any

import pytest
from strata_operator import kube
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.handlers import kvcachetier_io
from strata_operator.handlers import kvcachetier_reconcile as tier_reconcile
from strata_operator.handlers import modelcache_reconcile as cache_reconcile
from strata_operator.handlers.modelcache_io import Context
from strata_operator.resources.kvcachetier.children import build_children
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.modelcache.owner import Owner
from strata_operator.resources.runtime_image import RuntimeImage

OWNER = Owner(name="llama", namespace="serving", uid="uid-1", generation=1)
TIER = TierRef(name="kv", namespace="serving", uid="tier-uid", generation=1)
RUNTIME = RuntimeImage("registry.local/strata-runtime:test")


class Applied:
    def __init__(self, body: dict[str, Any]) -> None:
        self.body = body

    def to_dict(self) -> dict[str, Any]:
        meta = {**self.body["metadata"], "uid": "new-uid", "resourceVersion": "1"}
        return {**self.body, "metadata": meta}


@pytest.fixture
def applied(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []

    def fake_apply(body: dict[str, Any], **_: Any) -> Applied:
        calls.append(body)
        return Applied(body)

    monkeypatch.setattr(kube, "apply", fake_apply)
    return calls


def user_object(kind: str, name: str, **meta: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": kind, "metadata": {"name": name, "namespace": "serving", "uid": "u", **meta}}


def shared_context(**shared: Any) -> Context:
    spec = ModelCacheSpec.model_validate(
        {
            "source": {"uri": "s3://models/llama"},
            "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "10Gi", **shared}},
        }
    )
    body = {"metadata": {"name": OWNER.name, "namespace": OWNER.namespace, "uid": OWNER.uid}}
    return Context(body, OWNER, spec, {})


def test_a_users_claim_under_the_default_name_is_a_name_conflict(
    monkeypatch: pytest.MonkeyPatch, applied: list[dict[str, Any]]
) -> None:
    theirs_name = "llama-model"
    theirs = user_object("PersistentVolumeClaim", theirs_name, labels={"team": "data"})
    monkeypatch.setattr(cache_reconcile, "get_dict", lambda _v, _k, name, _ns: theirs if name == theirs_name else None)
    claim, problem = cache_reconcile.ensure_claim(shared_context())
    assert applied == [] and claim is None
    assert problem is not None and problem.reason == "NameConflict"
    assert "PersistentVolumeClaim 'llama-model'" in problem.message and "claimName: llama-model" in problem.message


def test_the_conflict_shows_as_ready_false_and_a_warning(
    monkeypatch: pytest.MonkeyPatch, applied: list[dict[str, Any]]
) -> None:
    theirs_name = "llama-model"
    theirs = user_object("PersistentVolumeClaim", theirs_name)
    monkeypatch.setattr(cache_reconcile, "get_dict", lambda _v, _k, name, _ns: theirs if name == theirs_name else None)
    patches: list[Any] = []
    monkeypatch.setattr(cache_reconcile, "patch_status", lambda _o, patch: patches.append(patch))
    body = {
        "metadata": {"name": OWNER.name, "namespace": OWNER.namespace, "uid": OWNER.uid, "generation": 1},
        "spec": {
            "source": {"uri": "s3://models/llama"},
            "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}},
        },
    }
    status, events = cache_reconcile.reconcile(body, {})
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"]) == ("False", "NameConflict")
    assert ("Warning", "NameConflict") in [(t, r) for t, r, _ in events]
    assert applied == []


def test_our_own_claim_is_still_repaired(monkeypatch: pytest.MonkeyPatch, applied: list[dict[str, Any]]) -> None:
    """Made by this cache (its ownerReference), or kept by Retain (our labels, no ownerReference)."""
    for meta in (
        {"ownerReferences": [OWNER.reference()]},
        {"labels": OWNER.labels("model")},
    ):
        ours = user_object("PersistentVolumeClaim", "llama-model", **meta)
        ours["spec"] = {"resources": {"requests": {"storage": "1Gi"}}}
        monkeypatch.setattr(cache_reconcile, "get_dict", lambda *_a, live=ours: live)
        applied.clear()
        claim, problem = cache_reconcile.ensure_claim(shared_context())
        assert problem is None and claim is not None and len(applied) == 1


def test_claim_name_adopts_on_purpose(monkeypatch: pytest.MonkeyPatch, applied: list[dict[str, Any]]) -> None:
    theirs = user_object("PersistentVolumeClaim", "data")
    monkeypatch.setattr(cache_reconcile, "get_dict", lambda *_a: theirs)
    ctx = shared_context(claimName="data")
    ctx.spec.storage.shared_pvc.size = None  # type: ignore[union-attr]
    claim, problem = cache_reconcile.ensure_claim(ctx)
    assert problem is None and claim is theirs and applied == []


def tier_spec() -> KVCacheTierSpec:
    return KVCacheTierSpec.model_validate({})


def test_a_users_config_map_named_like_the_tiers_is_a_name_conflict(
    monkeypatch: pytest.MonkeyPatch, applied: list[dict[str, Any]]
) -> None:
    theirs = user_object("ConfigMap", "kv-config", labels={"app": "mine"})
    wanted = ("ConfigMap", "kv-config")
    monkeypatch.setattr(kvcachetier_io, "read", lambda _v, kind, name, _ns: theirs if (kind, name) == wanted else None)
    problem = tier_reconcile.apply_children(build_children(tier_spec(), TIER, RUNTIME), TIER)
    assert problem is not None and problem.reason == "NameConflict"
    assert "ConfigMap 'kv-config'" in problem.message
    assert "kv-config" not in [c["metadata"]["name"] for c in applied]


def test_the_tiers_own_children_are_applied(monkeypatch: pytest.MonkeyPatch, applied: list[dict[str, Any]]) -> None:
    children = build_children(tier_spec(), TIER, RUNTIME)
    live = {c["metadata"]["name"]: c for c in children.in_apply_order()}
    monkeypatch.setattr(kvcachetier_io, "read", lambda _v, kind, name, _ns: live.get(name))
    assert tier_reconcile.apply_children(children, TIER) is None
    assert len(applied) == len(children.in_apply_order())
