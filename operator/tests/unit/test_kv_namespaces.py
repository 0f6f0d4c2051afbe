"""The model <-> KV link as pure functions: the revision a pod's KV namespace carries, and which old revisions'
namespaces a tier collects."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier import namespaces as ns
from strata_operator.webhook.wiring import (
    MODEL_DIR_ENV,
    MODEL_READY_GATE,
    WiringConflict,
    build_pod_patch,
    rewire_revision,
)

from .test_serving_wiring import NOT_READY, apply_patch, cache, pod, tier

COMMIT = "0123456789abcdef0123456789abcdef01234567"
DIGEST = "sha256:" + "fe" * 32


def kv_pod(**spec: Any) -> dict[str, Any]:
    p = pod(**spec)
    p["metadata"]["labels"]["strata.dev/kv-cache-tier"] = "kv"
    return p


def env_of(p: dict[str, Any], name: str) -> str:
    (value,) = [e["value"] for e in p["spec"]["containers"][0]["env"] if e["name"] == name]
    return value


@pytest.mark.parametrize(
    ("status", "expected"),
    [
        ({"resolvedRevision": COMMIT}, COMMIT[:12]),
        ({"resolvedRevision": DIGEST}, "fe" * 6),
        ({"resolvedDigest": DIGEST, "manifestSha256": "ab" * 32}, "fe" * 6),
        ({"resolvedRevision": "v1-label", "manifestSha256": "cd" * 32}, "cd" * 6),
        ({"manifestSha256": "sha256:" + "5e" * 32}, "5e" * 6),
        ({"image": {"digest": "sha256:" + "7a" * 32}}, "7a" * 6),
        ({"resolvedRevision": "main"}, None),
        ({}, None),
    ],
)
def test_a_caches_revision_is_its_commit_digest_or_manifest(status: dict[str, Any], expected: str | None) -> None:
    assert ns.cache_revision({"status": status}) == expected


def test_the_engine_is_given_a_model_path_carrying_the_revision_and_the_pod_records_it() -> None:
    c = cache(resolvedRevision=COMMIT)
    wired = apply_patch(kv_pod(), build_pod_patch(kv_pod(), model_cache=c, kv_tier=tier()))
    path = env_of(wired, MODEL_DIR_ENV)
    assert path.endswith(f"/rev-{COMMIT[:12]}")
    assert wired["spec"]["containers"][0]["volumeMounts"][0]["mountPath"] == path
    assert env_of(wired, ns.REVISION_ENV) == COMMIT[:12]
    annotations = wired["metadata"]["annotations"]
    assert annotations[ns.KV_MODEL_ANNOTATION] == path
    assert annotations[ns.REVISION_ANNOTATION] == COMMIT[:12]
    assert annotations[ns.MODEL_CACHE_ANNOTATION] == "llama"
    assert build_pod_patch(wired, model_cache=c, kv_tier=tier()) == []  # idempotent


def test_two_revisions_give_two_model_names_and_so_two_namespaces() -> None:
    paths = set()
    for revision in (COMMIT, "f" * 40):
        wired = apply_patch(
            kv_pod(), build_pod_patch(kv_pod(), model_cache=cache(resolvedRevision=revision), kv_tier=tier())
        )
        paths.add(wired["metadata"]["annotations"][ns.KV_MODEL_ANNOTATION])
    assert len(paths) == 2
    a, b = sorted(paths)
    assert ns.belongs(a.replace("/", "_") + "_0123456789ab", a)
    assert not ns.belongs(a.replace("/", "_") + "_0123456789ab", b)


def test_a_model_cache_alone_keeps_its_plain_mount_path() -> None:
    wired = apply_patch(pod(), build_pod_patch(pod(), model_cache=cache(resolvedRevision=COMMIT)))
    assert "rev-" not in env_of(wired, MODEL_DIR_ENV)
    assert "annotations" not in wired["metadata"] or ns.REVISION_ANNOTATION not in wired["metadata"]["annotations"]


def test_a_pod_wired_before_keeps_its_revision_when_the_cache_moves_on() -> None:
    first = apply_patch(kv_pod(), build_pod_patch(kv_pod(), model_cache=cache(resolvedRevision=COMMIT), kv_tier=tier()))
    moved = cache(resolvedRevision="f" * 40)
    assert build_pod_patch(first, model_cache=moved, kv_tier=tier(), creating=False) == []


def test_before_a_revision_is_resolved_a_pinned_commit_or_the_request_names_the_namespace() -> None:
    unresolved = cache(conditions=[NOT_READY], manifestSha256=None)
    wired = apply_patch(kv_pod(), build_pod_patch(kv_pod(), model_cache=unresolved, kv_tier=tier()))
    token = wired["metadata"]["annotations"][ns.REVISION_ANNOTATION]
    assert token == ns.request_revision(unresolved) and token.startswith("req-")
    assert env_of(wired, MODEL_DIR_ENV).endswith(f"/{token}")
    assert {"name": MODEL_READY_GATE} in wired["spec"]["schedulingGates"]  # still gated until the cache is Ready
    other_request = copy.deepcopy(unresolved)
    other_request["spec"]["source"]["revision"] = "v2"
    assert ns.request_revision(other_request) != token
    assert token in ns.current_revisions(unresolved) and token not in ns.current_revisions(other_request)
    resolved = copy.deepcopy(unresolved)
    resolved["status"]["manifestSha256"] = "sha256:" + "5e" * 32
    assert ns.current_revisions(resolved) == {"5e" * 6}, "once resolved, the request's namespace is no longer given"
    unresolved["spec"]["source"]["revision"] = COMMIT
    wired = apply_patch(kv_pod(), build_pod_patch(kv_pod(), model_cache=unresolved, kv_tier=tier()))
    assert wired["metadata"]["annotations"][ns.REVISION_ANNOTATION] == COMMIT[:12]


def test_a_cache_without_a_source_is_refused() -> None:
    sourceless = cache(manifestSha256=None)
    sourceless["spec"]["source"] = {}
    sourceless["status"]["volume"] = {
        "volume": {"name": "model", "emptyDir": {}},
        "volumeMount": {"name": "model", "mountPath": "/models/x"},
    }
    with pytest.raises(WiringConflict, match="no source to name its revision by"):
        build_pod_patch(kv_pod(), model_cache=sourceless, kv_tier=tier())


def test_flags_that_change_kv_bytes_beyond_vllms_digest_enter_the_model_path() -> None:
    rope = '{"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}'
    paths = []
    for args in ([], ["--hf-overrides", rope], [f"--hf-overrides={rope}"], ["--quantization", "fp8"]):
        p = kv_pod(containers=[{"name": "vllm", "image": "v", "args": list(args)}])
        wired = apply_patch(p, build_pod_patch(p, model_cache=cache(resolvedRevision=COMMIT), kv_tier=tier()))
        paths.append(env_of(wired, MODEL_DIR_ENV))
    plain, spaced, joined, quantized = paths
    assert plain.endswith(f"rev-{COMMIT[:12]}") and "-kv-" in spaced
    assert spaced == joined and len({plain, spaced, quantized}) == 3


# -- collection ---------------------------------------------------------------------------------------------
NOW = "2026-12-04T12:00:00Z"
LATER = "2026-12-04T13:00:01Z"
OLD, NEW = "aaaaaaaaaaaa", "bbbbbbbbbbbb"


def served_pod(revision: str, phase: str = "Running") -> dict[str, Any]:
    return {
        "metadata": {
            "annotations": {
                ns.MODEL_CACHE_ANNOTATION: "llama",
                ns.REVISION_ANNOTATION: revision,
                ns.KV_MODEL_ANNOTATION: f"/models/llama/rev-{revision}",
            }
        },
        "status": {"phase": phase},
    }


def spec(**gc: Any) -> KVCacheTierSpec:
    return KVCacheTierSpec.model_validate({"namespaceCollection": gc} if gc else {})


def observation(pods: list[dict[str, Any]], current: str | None, now: str) -> ns.NamespaceObservation:
    return ns.NamespaceObservation(pods=pods, current={"llama": frozenset([current] if current else [])}, now=now)


def test_an_old_revision_is_due_only_after_its_pods_went_and_the_grace_period_passed() -> None:
    both = ns.plan_collection(spec(), {}, observation([served_pod(OLD), served_pod(NEW)], NEW, NOW))
    assert [r["servingPods"] for r in both.records] == [1, 1] and both.due == []
    status = {"namespaces": both.records}
    gone = ns.plan_collection(spec(), status, observation([served_pod(NEW)], NEW, NOW))
    (old,) = [r for r in gone.records if r["revision"] == OLD]
    assert old["idleSince"] == NOW and gone.due == []  # within the grace period (default one hour)
    later = ns.plan_collection(spec(), {"namespaces": gone.records}, observation([served_pod(NEW)], NEW, LATER))
    assert [r["revision"] for r in later.due] == [OLD]


def test_the_current_revision_and_a_served_one_are_never_due() -> None:
    status = {"namespaces": ns.track([], [served_pod(OLD)], NOW)}
    idle_current = ns.plan_collection(spec(gracePeriodSeconds=0), status, observation([], OLD, LATER))
    assert idle_current.due == []
    served_old = ns.plan_collection(spec(gracePeriodSeconds=0), status, observation([served_pod(OLD)], NEW, LATER))
    assert served_old.due == []
    disabled = ns.plan_collection(spec(enabled=False, gracePeriodSeconds=0), status, observation([], NEW, LATER))
    assert disabled.due == []


def test_finished_pods_do_not_serve_and_a_deleted_cache_has_no_current_revision() -> None:
    status = {"namespaces": ns.track([], [served_pod(OLD)], NOW)}
    plan = ns.plan_collection(
        spec(gracePeriodSeconds=0), status, observation([served_pod(OLD, "Succeeded")], None, NOW)
    )
    assert [r["revision"] for r in plan.due] == [OLD]


def test_settling_reports_what_every_server_freed_and_keeps_a_record_a_server_missed() -> None:
    status = {"namespaces": ns.track([], [served_pod(OLD)], NOW)}
    plan = ns.plan_collection(spec(gracePeriodSeconds=0), status, observation([], NEW, NOW))
    key = ("llama", OLD, f"/models/llama/rev-{OLD}")
    namespace = f"_models_llama_rev-{OLD}_0123456789ab"
    done = {key: [ns.ServerDrops("kv-a", {namespace: (3, 300)}), ns.ServerDrops("kv-b", {namespace: (1, 100)})]}
    fields, events = ns.settle_collection(plan, done, {}, LATER)
    assert "namespaces" not in fields
    assert fields["collectedNamespaces"] == [
        {"namespace": namespace, "modelCache": "llama", "revision": OLD, "blocks": 4, "freedBytes": 400, "time": LATER}
    ]
    assert events == [("Normal", "NamespaceCollected", events[0][2])] and "freed 400 bytes" in events[0][2]
    partial = {key: [ns.ServerDrops("kv-a", {namespace: (3, 300)}), ns.ServerDrops("kv-b", error="not ready")]}
    fields, _ = ns.settle_collection(plan, partial, {}, LATER)
    (pending,) = fields["namespaces"]
    assert "kv-b: not ready" in pending["pending"]


def test_an_entry_equal_to_one_in_the_log_is_still_an_addition() -> None:
    """Two servers freeing the same bytes of one namespace in the same second, one reconcile each."""
    entry = {"namespace": "n", "modelCache": "llama", "revision": OLD, "blocks": 4, "freedBytes": 400, "time": LATER}
    read = {"collectedNamespaces": [entry]}
    assert ns.added_collected(read, {"collectedNamespaces": [entry, dict(entry)]}) == [entry]
    assert ns.added_collected(read, {"collectedNamespaces": [entry]}) == []
    assert ns.added_collected(read, {"namespaces": []}) == []


def test_the_grace_period_is_bounded() -> None:
    with pytest.raises(ValueError):
        spec(gracePeriodSeconds=-1)
    with pytest.raises(ValueError):
        spec(gracePeriodSeconds=31 * 24 * 3600)


def gated_pod(wired: str, owner: str | None) -> dict[str, Any]:
    owners = [{"kind": owner, "name": "llm-5d4", "uid": "rs1", "controller": True}] if owner else []
    p = pod({ns.REVISION_ANNOTATION: wired})
    p["metadata"]["ownerReferences"] = owners
    return p


@pytest.mark.parametrize("owner", ["ReplicaSet", "StatefulSet"])
def test_a_gated_pod_wired_with_the_request_is_replaced_once_the_revision_is_resolved(owner: str) -> None:
    """Its controller re-creates it wired with the revision, so the first engine's KV is the one later ones share."""
    resolved = cache()  # Ready, its manifest names the revision
    assert rewire_revision(gated_pod("req-0123456789ab", owner), resolved) == ns.cache_revision(resolved)


@pytest.mark.parametrize(
    ("wired", "owner"),
    [
        ("req-0123456789ab", None),  # a bare pod: nothing would create it again
        ("req-0123456789ab", "Job"),  # a Job counts a deleted pod as failed
        ("0123456789ab", "ReplicaSet"),  # wired with a revision already
    ],
)
def test_other_gated_pods_only_have_their_gate_lifted(wired: str, owner: str | None) -> None:
    assert rewire_revision(gated_pod(wired, owner), cache()) is None


def test_a_cache_still_without_a_revision_replaces_nothing() -> None:
    unresolved = cache()
    unresolved["status"].pop("manifestSha256")
    assert rewire_revision(gated_pod(ns.request_revision(unresolved) or "", "ReplicaSet"), unresolved) is None
