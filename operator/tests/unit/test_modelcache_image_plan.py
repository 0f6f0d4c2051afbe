"""ImageVolume's plan on plain observations: the tag resolved to a digest that pods and pre-pulls mount, kept
while the tag moves, failures of the registry and of the kubelet's pulls as Degraded with their reason."""

from __future__ import annotations

import datetime
from typing import Any

from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.modelcache import names
from strata_operator.resources.modelcache.draft import LabelChange, Plan
from strata_operator.resources.modelcache.image import (
    ImageLookup,
    lookup_due,
    lookup_platform,
)
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.observed import Observed
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.plan import plan

OWNER = CacheRef(name="llama", namespace="serving", uid="cache-uid", generation=3)
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
TAG = "registry.local/models/llama:1"
DIGEST = "sha256:" + "a" * 64
PINNED = f"registry.local/models/llama@{DIGEST}"
NODES = {
    "gpu-a": NodeInfo("gpu-a", "uid-a", True, {"pool": "gpu", "kubernetes.io/arch": "arm64"}),
    "gpu-b": NodeInfo("gpu-b", "uid-b", True, {"pool": "gpu"}),
    "cpu-a": NodeInfo("cpu-a", "uid-c", True, {"pool": "cpu", "kubernetes.io/arch": "amd64"}),
}
KEY = names.node_label_key("serving", "llama")


def image_spec(**volume: Any) -> ModelCacheSpec:
    storage: dict[str, Any] = {"mode": "ImageVolume"}
    if volume:
        storage["imageVolume"] = volume
    return ModelCacheSpec.model_validate({"source": {"uri": f"oci://{TAG}"}, "storage": storage})


def resolved(size: int = 3 << 20) -> ImageLookup:
    return ImageLookup(
        TAG,
        "linux/amd64",
        digest=DIGEST,
        reference=PINNED,
        platform_digest="sha256:" + "b" * 64,
        size_bytes=size,
        layers=3,
    )


def failed(failure: str, message: str, *, transient: bool = False) -> ImageLookup:
    return ImageLookup(TAG, "linux/amd64", failure=failure, message=message, transient=transient)


def observe(spec: ModelCacheSpec, **facts: Any) -> Observed:
    return Observed(owner=OWNER, previous=facts.pop("previous", {}), now=NOW, spec=spec, **facts)


def condition(result: Plan, type_: str) -> dict[str, Any]:
    return next(c for c in result.status["conditions"] if c["type"] == type_)


def test_the_tag_resolves_to_a_digest_that_pods_mount() -> None:
    result = plan(observe(image_spec(pullSecretRef={"name": "regcred"}), nodes=NODES, image=resolved()))
    assert result.status["phase"] == "Ready" and result.actions == []
    image = result.status["image"]
    assert (image["reference"], image["digest"], image["resolvedFrom"]) == (PINNED, DIGEST, TAG)
    assert image["sizeBytes"] == 3 << 20 and result.status["totalBytes"] == 3 << 20
    assert result.status["volume"]["volume"]["image"] == {"reference": PINNED, "pullPolicy": "IfNotPresent"}
    assert result.status["volume"]["imagePullSecrets"] == [{"name": "regcred"}]


def test_a_pinned_digest_stays_while_the_tag_moves() -> None:
    first = plan(observe(image_spec(), nodes=NODES, image=resolved()))
    assert not lookup_due(image_spec(), first.status, "", OWNER.generation, NOW + datetime.timedelta(days=30))
    again = plan(observe(image_spec(), nodes=NODES, previous=first.status))  # nothing looked up
    assert again.status["volume"]["volume"]["image"]["reference"] == PINNED
    assert again.status["image"] == first.status["image"]


def test_a_new_annotation_value_or_no_pin_resolves_again() -> None:
    spec = image_spec()
    assert lookup_due(spec, {}, "", 3, NOW)
    pinned = plan(observe(spec, nodes=NODES, image=resolved())).status
    assert lookup_due(spec, pinned, "2026-01-02", 3, NOW)
    answered = plan(observe(spec, nodes=NODES, image=resolved(), resolve_request="2026-01-02", previous=pinned))
    assert answered.status["image"]["resolveRequest"] == "2026-01-02"
    assert not lookup_due(spec, answered.status, "2026-01-02", 3, NOW)


def test_a_denied_pull_ends_degraded_with_the_registrys_message() -> None:
    message = "10.0.0.1:5000 refused the credentials for GET manifest models/llama:1 (401)"
    result = plan(observe(image_spec(), nodes=NODES, image=failed("Denied", message)))
    assert result.status["phase"] == "Degraded" and "volume" not in result.status
    degraded = condition(result, "Degraded")
    assert degraded["status"] == "True" and degraded["reason"] == "ImagePullDenied"
    assert message in degraded["message"] and TAG in degraded["message"]
    assert condition(result, "Ready")["status"] == "False"
    assert condition(result, "Stalled")["status"] == "True"  # a person must fix the credentials
    assert result.status["image"]["failures"] == 1 and result.status["image"]["nextAttempt"] == "2026-01-01T00:00:30Z"


def test_missing_images_and_wrong_digests_name_their_cause() -> None:
    for failure, reason in (("NotFound", "ImageNotFound"), ("DigestMismatch", "ImageDigestMismatch")):
        result = plan(observe(image_spec(), nodes=NODES, image=failed(failure, "404 MANIFEST_UNKNOWN")))
        assert condition(result, "Degraded")["reason"] == reason
        assert "MANIFEST_UNKNOWN" in condition(result, "Degraded")["message"]


def test_failures_are_retried_with_back_off() -> None:
    spec = image_spec()
    once = plan(observe(spec, nodes=NODES, image=failed("Unreachable", "connection refused", transient=True)))
    assert condition(once, "Reconciling")["status"] == "True"  # a transient failure: retrying on its own
    assert not lookup_due(spec, once.status, "", 3, NOW + datetime.timedelta(seconds=29))
    assert lookup_due(spec, once.status, "", 3, NOW + datetime.timedelta(seconds=30))
    later = NOW + datetime.timedelta(seconds=30)
    twice = plan(
        Observed(
            owner=OWNER,
            previous=once.status,
            now=later,
            spec=spec,
            nodes=NODES,
            image=failed("Unreachable", "connection refused", transient=True),
        )
    )
    assert twice.status["image"]["failures"] == 2 and twice.status["image"]["nextAttempt"] == "2026-01-01T00:01:30Z"
    waiting = plan(Observed(owner=OWNER, previous=twice.status, now=later, spec=spec, nodes=NODES))
    assert condition(waiting, "Degraded")["reason"] == "RegistryUnreachable"  # still said while it waits
    # ...and still retrying on its own: Reconciling (Flux: InProgress), not Stalled, between attempts too.
    assert condition(waiting, "Reconciling")["status"] == "True" and condition(waiting, "Stalled")["status"] == "False"
    assert "trying again after 2026-01-01T00:01:30Z" in condition(waiting, "Reconciling")["message"]
    assert lookup_due(spec, twice.status, "", 4, later)  # a spec change tries at once
    fixed = plan(Observed(owner=OWNER, previous=twice.status, now=later, spec=spec, nodes=NODES, image=resolved()))
    assert fixed.status["phase"] == "Ready" and "failures" not in fixed.status["image"]


def test_a_failed_re_resolution_keeps_the_digest_in_force() -> None:
    pinned = plan(observe(image_spec(), nodes=NODES, image=resolved())).status
    result = plan(
        observe(
            image_spec(),
            nodes=NODES,
            previous=pinned,
            resolve_request="again",
            image=failed("NotFound", "404 MANIFEST_UNKNOWN"),
        )
    )
    assert condition(result, "Ready")["status"] == "True"
    assert result.status["volume"]["volume"]["image"]["reference"] == PINNED
    assert condition(result, "Degraded")["reason"] == "ImageNotFound"
    assert condition(result, "Stalled")["status"] == "True"  # the tag is gone: a person must look (Flux: Failed)
    blip = plan(
        observe(
            image_spec(),
            nodes=NODES,
            previous=pinned,
            resolve_request="again",
            image=failed("Unreachable", "connection refused", transient=True),
        )
    )
    assert condition(blip, "Ready")["status"] == "True" and condition(blip, "Reconciling")["status"] == "True"
    assert condition(blip, "Stalled")["status"] == "False"  # it may pass by itself


def prepull_spec() -> ModelCacheSpec:
    return image_spec(prePull=True, nodeSelector={"pool": "gpu"}, pullSecretRef={"name": "regcred"})


def test_pre_pulls_mount_the_digest_with_the_pull_secret() -> None:
    result = plan(observe(prepull_spec(), nodes=NODES, image=resolved(), inputs_checked=True))
    jobs = [a.body for a in result.actions if a.verb == "apply"]
    assert [j["metadata"]["annotations"]["strata.dev/node"] for j in jobs] == ["gpu-a", "gpu-b"]
    pod = jobs[0]["spec"]["template"]["spec"]
    assert {"name": "model", "image": {"reference": PINNED, "pullPolicy": "IfNotPresent"}} in pod["volumes"]
    assert {"name": "regcred"} in pod["imagePullSecrets"]
    assert result.status["phase"] == "Ready" and condition(result, "Reconciling")["status"] == "True"


def running(job: dict[str, Any]) -> dict[str, Any]:
    return {**job, "status": {"active": 1}}


def pulling_pod(reason: str, message: str) -> dict[str, Any]:
    waiting = {"waiting": {"reason": reason, "message": message}}
    return {
        "metadata": {"creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"phase": "Pending", "containerStatuses": [{"name": "preload", "state": waiting}]},
    }


def test_a_pull_the_kubelet_cannot_make_ends_degraded_with_the_runtimes_message() -> None:
    spec = prepull_spec()
    first = plan(observe(spec, nodes=NODES, image=resolved(), inputs_checked=True))
    jobs = {a.body["metadata"]["name"]: running(a.body) for a in first.actions}
    a, b = sorted(jobs)
    message = "failed to pull and unpack image: failed to resolve reference: 403 Forbidden"
    pods = {a: [pulling_pod("ErrImagePull", message)], b: []}
    result = plan(observe(spec, nodes=NODES, previous=first.status, jobs=jobs, pods=pods))
    states = {n["name"]: n for n in result.status["nodes"]}
    failing = next(s for s in states.values() if s["job"] == a)
    assert failing["phase"] == "Failed" and failing["message"] == f"ErrImagePull: {message}"
    degraded = condition(result, "Degraded")
    assert degraded["reason"] == "PrePullFailed" and message in degraded["message"]
    assert result.status["phase"] == "Degraded"


def test_a_pulled_node_gets_the_ready_label_and_loses_it_when_pre_pulls_stop() -> None:
    spec = prepull_spec()
    first = plan(observe(spec, nodes=NODES, image=resolved(), inputs_checked=True))
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    jobs = {a.body["metadata"]["name"]: {**a.body, **done} for a in first.actions}
    result = plan(observe(spec, nodes=NODES, previous=first.status, jobs=jobs))
    assert result.status["readyNodes"] == 2 and result.status["nodeLabel"] == KEY
    assert result.labels == [LabelChange("gpu-a", KEY, "Ready"), LabelChange("gpu-b", KEY, "Ready")]
    labelled = {n: NodeInfo(i.name, i.uid, i.ready, {**i.labels, KEY: "Ready"}) for n, i in NODES.items()}
    off = plan(observe(image_spec(), nodes=labelled, previous=result.status))
    assert sorted(c.node for c in off.labels if c.value is None) == ["cpu-a", "gpu-a", "gpu-b"]


def test_the_platform_looked_up_is_the_selected_nodes() -> None:
    assert lookup_platform(NODES, {"pool": "gpu"}) == "linux/arm64"
    assert lookup_platform(NODES, {"pool": "none"}) == "linux/amd64"
