"""The pod wiring as a pure function: each storage mode, the KV tier, idempotence, conflicts and the gate."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from strata_operator.webhook.wiring import (
    KV_ARGS_ANNOTATION,
    KV_ENGINE_ANNOTATION,
    MODEL_READY_GATE,
    SHM_SIZE_ANNOTATION,
    WiringConflict,
    WiringRequest,
    build_pod_patch,
    cache_failure,
    cache_is_ready,
)

READY = {"type": "Ready", "status": "True", "reason": "Preloaded", "message": "ok"}
MANIFEST = "ab" * 32
NOT_READY = {"type": "Ready", "status": "False", "reason": "Preloading", "message": "copying"}


PINNED = "registry.example/models/llama@sha256:" + "a" * 64
IMAGE_VOLUME_STATUS = {
    "volume": {"name": "model-llama", "image": {"reference": PINNED, "pullPolicy": "IfNotPresent"}},
    "volumeMount": {"name": "model-llama", "mountPath": "/models", "readOnly": True},
    "imagePullSecrets": [{"name": "regcred"}],
}
"""What the operator writes in status.volume once the image's tag is resolved (with a pull Secret)."""


def cache(mode: str = "SharedPVC", conditions: list[dict[str, Any]] | None = None, **status: Any) -> dict[str, Any]:
    storage: dict[str, Any] = {"mode": mode}
    uri = "oci://registry.example/models/llama:1" if mode == "ImageVolume" else "s3://models/llama"
    if mode == "SharedPVC":
        storage["sharedPVC"] = {"size": "100Gi"}
    if mode == "ImageVolume":
        status.setdefault("volume", IMAGE_VOLUME_STATUS)
    return {
        "metadata": {"name": "llama", "namespace": "serving", "uid": "u1"},
        "spec": {"source": {"uri": uri}, "storage": storage},
        "status": {"conditions": [READY] if conditions is None else conditions, "manifestSha256": MANIFEST, **status},
    }


def tier(spec: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "kv", "namespace": "serving", "uid": "u2"}, "spec": spec or {}, "status": status}


def pod(annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    containers = spec.pop("containers", None) or [{"name": "vllm", "image": "vllm"}, {"name": "proxy", "image": "p"}]
    return {
        "metadata": {"name": "p", "labels": {"strata.dev/model-cache": "llama"}, "annotations": annotations or {}},
        "spec": {"containers": containers, **spec},
    }


def apply_patch(document: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """RFC 6902 `add` (the only operation the wiring emits), applied as the API server would."""
    result = copy.deepcopy(document)
    for op in ops:
        assert op["op"] == "add"
        *parents, last = op["path"].lstrip("/").split("/")
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        target[last] = op["value"]
    return result


def wired(p: dict[str, Any], **objects: Any) -> dict[str, Any]:
    return apply_patch(p, build_pod_patch(p, **objects))


def test_shared_pvc_mounts_the_claim_read_only_into_every_container_with_the_model_dir() -> None:
    out = wired(pod(), model_cache=cache())
    assert out["spec"]["volumes"] == [
        {"name": "model-llama", "persistentVolumeClaim": {"claimName": "llama-model", "readOnly": True}}
    ]
    for container in out["spec"]["containers"]:
        assert container["volumeMounts"] == [{"name": "model-llama", "mountPath": "/models", "readOnly": True}]
        assert {"name": "STRATA_MODEL_DIR", "value": "/models"} in container["env"]
    assert "schedulingGates" not in out["spec"] and "affinity" not in out["spec"]


def test_node_local_uses_the_host_path_and_requires_a_node_with_a_ready_copy() -> None:
    out = wired(pod(), model_cache=cache("NodeLocal", readyNodes=1, conditions=[NOT_READY]))
    host_path = {"path": "/var/lib/strata/models/serving/llama", "type": "Directory"}
    assert out["spec"]["volumes"][0]["hostPath"] == host_path
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "strata.dev/model.serving.llama", "operator": "In", "values": ["Ready"]}]}
    ]
    assert "schedulingGates" not in out["spec"], "one ready node is enough to schedule"


def test_node_local_affinity_is_added_to_every_term_the_user_wrote() -> None:
    user_terms = [{"matchExpressions": [{"key": "gpu", "operator": "Exists"}]}, {"matchFields": []}]
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": user_terms}}}
    out = wired(pod(affinity=affinity), model_cache=cache("NodeLocal"))
    terms = out["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    for term in terms["nodeSelectorTerms"]:
        assert {"key": "strata.dev/model.serving.llama", "operator": "In", "values": ["Ready"]} in term[
            "matchExpressions"
        ]
    assert terms["nodeSelectorTerms"][0]["matchExpressions"][0] == {"key": "gpu", "operator": "Exists"}


def test_image_volume_mounts_the_resolved_digest_with_the_pull_secret() -> None:
    out = wired(pod(), model_cache=cache("ImageVolume"))
    assert out["spec"]["volumes"][0]["image"] == {"reference": PINNED, "pullPolicy": "IfNotPresent"}
    assert out["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    mine = pod()
    mine["spec"]["imagePullSecrets"] = [{"name": "own"}]
    assert wired(mine, model_cache=cache("ImageVolume"))["spec"]["imagePullSecrets"] == [
        {"name": "own"},
        {"name": "regcred"},
    ]


def test_an_image_not_resolved_yet_is_refused_with_the_reason() -> None:
    unresolved = cache("ImageVolume", conditions=[NOT_READY], volume=None, image={"message": "401 denied"})
    with pytest.raises(WiringConflict, match="has not resolved its image to a digest yet: 401 denied"):
        build_pod_patch(pod(), model_cache=unresolved)


def test_the_status_snippet_is_what_gets_injected() -> None:
    snippet = {
        "volume": {"name": "model-llama", "persistentVolumeClaim": {"claimName": "adopted", "readOnly": True}},
        "volumeMount": {"name": "model-llama", "mountPath": "/weights", "readOnly": True},
    }
    out = wired(pod(), model_cache=cache(volume=snippet))
    assert out["spec"]["volumes"] == [snippet["volume"]]
    assert out["spec"]["containers"][0]["volumeMounts"] == [snippet["volumeMount"]]
    assert {"name": "STRATA_MODEL_DIR", "value": "/weights"} in out["spec"]["containers"][0]["env"]


def test_annotations_choose_the_mount_path_and_the_containers() -> None:
    p = pod({"strata.dev/model-mount-path": "/srv/model", "strata.dev/containers": "vllm"})
    out = wired(p, model_cache=cache())
    vllm, proxy = out["spec"]["containers"]
    assert vllm["volumeMounts"][0]["mountPath"] == "/srv/model"
    assert "volumeMounts" not in proxy and "env" not in proxy


def test_an_unknown_container_name_is_refused() -> None:
    with pytest.raises(WiringConflict, match="names sidecar, which the pod does not have"):
        build_pod_patch(pod({"strata.dev/containers": "vllm,sidecar"}), model_cache=cache())


def test_a_cache_that_is_not_ready_gates_the_pod_only_at_creation() -> None:
    out = wired(pod(), model_cache=cache(conditions=[NOT_READY]))
    assert out["spec"]["schedulingGates"] == [{"name": MODEL_READY_GATE}]
    update = build_pod_patch(pod(), model_cache=cache(conditions=[NOT_READY]), creating=False)
    assert not any(op["path"] == "/spec/schedulingGates" for op in update)


def test_user_gates_are_kept() -> None:
    out = wired(pod(schedulingGates=[{"name": "example.com/quota"}]), model_cache=cache(conditions=[]))
    assert out["spec"]["schedulingGates"] == [{"name": "example.com/quota"}, {"name": MODEL_READY_GATE}]


def test_kv_tier_adds_the_connection_config_map_shm_and_opt_in_args() -> None:
    p = pod({SHM_SIZE_ANNOTATION: "8Gi", KV_ARGS_ANNOTATION: "true"}, containers=[{"name": "vllm", "args": ["m"]}])
    p["metadata"]["labels"] = {"strata.dev/kv-cache-tier": "kv"}
    out = wired(p, kv_tier=tier(connectionConfigMap="kv-connection"))
    (vllm,) = out["spec"]["containers"]
    assert vllm["envFrom"] == [{"configMapRef": {"name": "kv-connection"}}]
    assert vllm["volumeMounts"] == [{"name": "strata-shm", "mountPath": "/dev/shm"}]
    assert vllm["args"] == [
        "m",
        "--kv-transfer-config",
        "$(KV_TRANSFER_CONFIG)",
        "--prefix-caching-hash-algo",
        "$(PREFIX_CACHING_HASH_ALGO)",
    ]
    assert out["spec"]["volumes"] == [{"name": "strata-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}}]


def test_kv_tier_with_the_vllm_connector_gets_shm_for_its_cpu_tier_and_the_token() -> None:
    """vLLM allocates connector.cpuBytes in /dev/shm (64Mi in a container unless mounted): 4Gi + 1Gi headroom."""
    out = wired(pod(containers=[{"name": "vllm"}]), kv_tier=tier())
    (vllm,) = out["spec"]["containers"]
    assert vllm["envFrom"] == [{"configMapRef": {"name": "kv-connection"}}]
    assert out["spec"]["volumes"] == [{"name": "strata-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "5Gi"}}]
    assert vllm["volumeMounts"] == [{"name": "strata-shm", "mountPath": "/dev/shm"}]
    assert vllm["env"] == [
        {"name": "STRATA_KV_TOKEN", "valueFrom": {"secretKeyRef": {"name": "kv-kv-token", "key": "token"}}}
    ]


def test_kv_tier_with_lmcache_and_no_auth_only_adds_env_from() -> None:
    out = wired(
        pod(containers=[{"name": "vllm"}]),
        kv_tier=tier(spec={"connector": {"type": "lmcache"}, "auth": {"disabled": True}}),
    )
    assert out["spec"] == {"containers": [{"name": "vllm", "envFrom": [{"configMapRef": {"name": "kv-connection"}}]}]}


def test_a_tier_with_a_node_socket_mounts_it_read_only_and_joins_the_sockets_group() -> None:
    """Read-only is enough to connect to a Unix socket and keeps a client from replacing it; the socket is
    mode 0660 in the server's group, which the pod joins as a supplemental group (kept beside the user's)."""
    p = pod(containers=[{"name": "vllm"}, {"name": "proxy"}], securityContext={"supplementalGroups": [1000]})
    out = wired(p, kv_tier=tier(spec={"nodeSocket": {"enabled": True}}))
    assert {
        "name": "strata-kv-socket",
        "csi": {"driver": "kv.strata.dev", "readOnly": True, "volumeAttributes": {"tier": "kv"}},
    } in out["spec"]["volumes"]
    for container in out["spec"]["containers"]:
        assert {"name": "strata-kv-socket", "mountPath": "/run/strata-kv", "readOnly": True} in container[
            "volumeMounts"
        ]
    assert out["spec"]["securityContext"]["supplementalGroups"] == [1000, 65532]
    assert build_pod_patch(out, kv_tier=tier(spec={"nodeSocket": {"enabled": True}})) == []


def test_a_volume_of_the_sockets_name_the_user_set_is_a_conflict() -> None:
    p = pod(containers=[{"name": "vllm"}], volumes=[{"name": "strata-kv-socket", "emptyDir": {}}])
    with pytest.raises(WiringConflict, match=r"spec.volumes\[strata-kv-socket\] is already set"):
        build_pod_patch(p, kv_tier=tier(spec={"nodeSocket": {"enabled": True}}))


def test_a_tier_with_an_invalid_spec_is_named() -> None:
    with pytest.raises(WiringConflict, match="KVCacheTier kv has an invalid spec"):
        build_pod_patch(pod(containers=[{"name": "vllm"}]), kv_tier=tier(spec={"connector": {"cpuBytes": "1.5Gi"}}))


@pytest.mark.parametrize("mode", ["SharedPVC", "NodeLocal", "ImageVolume"])
def test_wiring_twice_changes_nothing_the_second_time(mode: str) -> None:
    p = pod({SHM_SIZE_ANNOTATION: "1Gi", KV_ARGS_ANNOTATION: "true"})
    objects = {"model_cache": cache(mode, conditions=[NOT_READY]), "kv_tier": tier()}
    once = wired(p, **objects)
    assert build_pod_patch(once, **objects) == []


def test_an_unlabelled_pod_asks_for_nothing() -> None:
    assert WiringRequest.from_pod({"metadata": {"labels": {"app": "x"}}}) is None
    assert WiringRequest.from_pod(pod()) == WiringRequest("llama", None)


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"volumes": [{"name": "model-llama", "emptyDir": {}}]}, r"spec.volumes\[model-llama\]"),
        (
            {"containers": [{"name": "vllm", "env": [{"name": "STRATA_MODEL_DIR", "value": "/x"}]}]},
            r"spec.containers\[vllm\].env\[STRATA_MODEL_DIR\]",
        ),
        (
            {"containers": [{"name": "vllm", "volumeMounts": [{"name": "mine", "mountPath": "/models"}]}]},
            r"spec.containers\[vllm\].volumeMounts",
        ),
    ],
)
def test_what_the_user_set_is_never_overwritten(spec: dict[str, Any], field: str) -> None:
    with pytest.raises(WiringConflict, match=field):
        build_pod_patch(pod(**spec), model_cache=cache())


def test_a_different_kv_transfer_config_is_a_conflict() -> None:
    p = pod({KV_ARGS_ANNOTATION: "true"}, containers=[{"name": "vllm", "args": ["--kv-transfer-config", "{}"]}])
    with pytest.raises(WiringConflict, match=r"spec.containers\[vllm\].args already passes --kv-transfer-config"):
        build_pod_patch(p, kv_tier=tier())


@pytest.mark.parametrize(("engine", "variable"), [("cpu", "KV_TRANSFER_CONFIG_CPU"), ("GPU", "KV_TRANSFER_CONFIG_GPU")])
def test_the_kv_engine_annotation_picks_the_transfer_config_for_that_engine(engine: str, variable: str) -> None:
    p = pod({KV_ARGS_ANNOTATION: "true", KV_ENGINE_ANNOTATION: engine}, containers=[{"name": "vllm", "args": ["m"]}])
    (vllm,) = wired(p, kv_tier=tier())["spec"]["containers"]
    assert vllm["args"][1:3] == ["--kv-transfer-config", f"$({variable})"]


def test_an_unknown_kv_engine_is_a_conflict_naming_the_choices() -> None:
    p = pod({KV_ARGS_ANNOTATION: "true", KV_ENGINE_ANNOTATION: "tpu"}, containers=[{"name": "vllm"}])
    with pytest.raises(WiringConflict, match=r"strata.dev/kv-engine is 'tpu': use one of gpu, cpu"):
        build_pod_patch(p, kv_tier=tier())


def test_a_kv_engine_with_the_lmcache_connector_is_a_conflict() -> None:
    p = pod({KV_ARGS_ANNOTATION: "true", KV_ENGINE_ANNOTATION: "cpu"}, containers=[{"name": "vllm"}])
    with pytest.raises(WiringConflict, match="uses the lmcache connector: remove the annotation"):
        build_pod_patch(p, kv_tier=tier({"connector": {"type": "lmcache"}}))


def test_readiness_and_failure_of_a_cache() -> None:
    assert cache_is_ready(cache()) and cache_failure(cache()) is None
    assert not cache_is_ready(cache("NodeLocal", conditions=[NOT_READY], readyNodes=0))
    degraded = {"type": "Degraded", "status": "True", "reason": "PreloadFailed", "message": "job failed 3 times"}
    assert cache_failure(cache(conditions=[NOT_READY, degraded])) == "job failed 3 times"
    assert cache_failure(cache(conditions=[NOT_READY])) is None
    # Every copy's node is down: its pods wait for the nodes to return (NodeNotReady), they are not refused.
    lost = {"type": "Degraded", "status": "True", "reason": "NodeNotReady", "message": "2 of 2 nodes: gpu-a: ..."}
    down = {**NOT_READY, "reason": "NodeNotReady"}
    assert cache_failure(cache("NodeLocal", conditions=[down, lost], readyNodes=0)) is None


def test_the_tier_asks_for_a_shm_and_a_pod_annotation_overrides_its_size() -> None:
    kv = tier()
    kv["spec"] = {"clientShmSize": "4Gi"}
    p = pod(containers=[{"name": "vllm"}])
    assert wired(p, kv_tier=kv)["spec"]["volumes"] == [
        {"name": "strata-shm", "emptyDir": {"medium": "Memory", "sizeLimit": "4Gi"}}
    ]
    p["metadata"]["annotations"] = {SHM_SIZE_ANNOTATION: "16Gi"}
    assert wired(p, kv_tier=kv)["spec"]["volumes"][0]["emptyDir"]["sizeLimit"] == "16Gi"
