"""The compile cache wired into a vLLM pod at admission (webhook.compile_cache): the key and restore init
containers in the engine's image, the capture sidecar as the only writer of the store, the engine's env, what the
pod can say, and the restricted security settings. Pure: plain dicts through `build_pod_patch`."""

from __future__ import annotations

from typing import Any

import pytest
from strata_operator.resources.modelcache.compile_cache import COMPILE_STORE_DIR, RESTORE_CONTAINER
from strata_operator.resources.runtime_image import RuntimeImage
from strata_operator.webhook.compile_cache import (
    CACHE_PATH,
    CACHE_VOLUME,
    CAPTURE_CONTAINER,
    COMPILE_CACHE_ANNOTATION,
    INDUCTOR_CACHE_DIR,
    KEY_CONTAINER,
    KEY_FILE,
    KEY_VOLUME,
    STORE_PATH,
    STORE_VOLUME,
    VLLM_CACHE_ROOT,
    engine_vllm_args,
)
from strata_operator.webhook.vllm_packages import COPY_CONTAINER, PACKAGES_VOLUME, VLLM_VERSION_ANNOTATION
from strata_operator.webhook.wiring import WiringConflict, build_pod_patch

from .test_serving_wiring import apply_patch, cache

RUNTIME = RuntimeImage("registry.local/strata-runtime:1.2.3", "Always", ())
ENGINE = {
    "name": "vllm",
    "image": "vllm/vllm-openai:v0.33.0",
    "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
    "args": ["--max-model-len", "4096"],
    "resources": {"limits": {"nvidia.com/gpu": "1"}},
}
STORE = f"{STORE_PATH}/{COMPILE_STORE_DIR}"


def compiling_cache(mode: str = "SharedPVC", **compile_cache: Any) -> dict[str, Any]:
    body = cache(mode)
    body["spec"]["compileCache"] = {"enabled": True, **compile_cache}
    if mode == "NodeLocal":
        body["spec"]["storage"]["nodeLocal"] = {"path": "/mnt/nvme/models"}
    return body


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "labels": {"strata.dev/model-cache": "llama"}, "annotations": annotations or {}},
        "spec": {"containers": [dict(c) for c in containers or (ENGINE,)]},
    }


def patch(p: dict[str, Any], model_cache: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return build_pod_patch(p, model_cache=model_cache or compiling_cache(), runtime=RUNTIME)


def wired(p: dict[str, Any], model_cache: dict[str, Any] | None = None) -> dict[str, Any]:
    return apply_patch(p, patch(p, model_cache))


def inits(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in out["spec"].get("initContainers") or []}


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env") or []}


def mounts(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in container.get("volumeMounts") or []}


def test_the_key_and_restore_run_before_the_engine_and_the_capture_sidecar_beside_it() -> None:
    out = wired(pod())
    names = [c["name"] for c in out["spec"]["initContainers"]]
    assert names[0] == COPY_CONTAINER  # the packages first: the key and restore import strata_loader from them
    assert names[-3:] == [KEY_CONTAINER, RESTORE_CONTAINER, CAPTURE_CONTAINER]
    init = inits(out)
    capture = init[CAPTURE_CONTAINER]
    assert capture["restartPolicy"] == "Always" and "restartPolicy" not in init[KEY_CONTAINER]
    assert capture["image"] == RUNTIME.image
    assert capture["command"] == [
        *("strata-loader", "compile", "capture", "--store", STORE, "--key", KEY_FILE),
        *("--vllm-cache-root", VLLM_CACHE_ROOT, "--inductor-cache-dir", INDUCTOR_CACHE_DIR),
        *("--max-bytes", str(20 * 2**30)),
        *("--if-missing", "--follow", "--stay"),
    ]
    restore = init[RESTORE_CONTAINER]
    assert restore["image"] == ENGINE["image"]
    assert restore["command"][:5] == ["python3", "-m", "strata_loader", "compile", "restore"]
    assert restore["command"][5:] == [
        *("--store", STORE, "--key", KEY_FILE),
        *("--vllm-cache-root", VLLM_CACHE_ROOT, "--inductor-cache-dir", INDUCTOR_CACHE_DIR),
    ]


def test_only_the_capture_sidecar_mounts_the_store_read_write_and_the_engine_not_at_all() -> None:
    out = wired(pod())
    volumes = {v["name"]: v for v in out["spec"]["volumes"]}
    assert volumes[STORE_VOLUME] == {"name": STORE_VOLUME, "persistentVolumeClaim": {"claimName": "llama-model"}}
    assert volumes["model-llama"]["persistentVolumeClaim"]["readOnly"] is True  # the model's own stays read-only
    assert volumes[CACHE_VOLUME] == {"name": CACHE_VOLUME, "emptyDir": {}}
    init = inits(out)
    assert mounts(init[CAPTURE_CONTAINER])[STORE_VOLUME] == {"name": STORE_VOLUME, "mountPath": STORE_PATH}
    assert mounts(init[CAPTURE_CONTAINER])[CACHE_VOLUME]["readOnly"] is True
    assert mounts(init[RESTORE_CONTAINER])[STORE_VOLUME]["readOnly"] is True
    assert STORE_VOLUME not in mounts(init[KEY_CONTAINER])
    engine = out["spec"]["containers"][0]
    assert STORE_VOLUME not in mounts(engine)
    assert mounts(engine)[CACHE_VOLUME] == {"name": CACHE_VOLUME, "mountPath": CACHE_PATH}


def test_node_local_keeps_the_store_in_the_nodes_copy() -> None:
    out = wired(pod(), compiling_cache("NodeLocal"))
    volumes = {v["name"]: v for v in out["spec"]["volumes"]}
    assert volumes[STORE_VOLUME]["hostPath"] == {"path": "/mnt/nvme/models/serving/llama", "type": "Directory"}


def test_the_engine_gets_the_cache_directories_and_aot_compile_off_for_032_and_033() -> None:
    engine = wired(pod())["spec"]["containers"][0]
    assert env(engine)["VLLM_CACHE_ROOT"] == VLLM_CACHE_ROOT
    assert env(engine)["TORCHINDUCTOR_CACHE_DIR"] == INDUCTOR_CACHE_DIR
    assert env(engine)["VLLM_USE_AOT_COMPILE"] == "0"  # undeclared: every served vLLM cannot reload AOT artifacts
    declared = pod(annotations={VLLM_VERSION_ANNOTATION: "0.32.1"})
    assert env(wired(declared)["spec"]["containers"][0])["VLLM_USE_AOT_COMPILE"] == "0"


def test_a_vllm_that_reloads_its_aot_artifacts_keeps_aot_compile() -> None:
    from strata_operator.webhook.compile_cache import engine_env

    assert "VLLM_USE_AOT_COMPILE" not in {e["name"] for e in engine_env({VLLM_VERSION_ANNOTATION: "0.34.0"})}
    assert {"name": "VLLM_USE_AOT_COMPILE", "value": "0"} in engine_env({VLLM_VERSION_ANNOTATION: "0.33.0"})


def test_the_key_sees_what_the_engine_sees() -> None:
    """Its env (the model path variable, AOT off), mounts (the model's config.json, the packages) and resources
    (the GPUs are the target part) are the engine's, so the key is the one the engine's compile has."""
    out = wired(pod())
    key = inits(out)[KEY_CONTAINER]
    engine = out["spec"]["containers"][0]
    separator = key["command"].index("--")
    assert key["command"][:separator] == [
        *("python3", "-m", "strata_loader", "compile", "key"),
        *("--image", ENGINE["image"], "--out", KEY_FILE),
    ]
    assert key["command"][separator + 1 :] == [
        *("--max-model-len", "4096", "--model", "$(STRATA_MODEL_DIR)", "--load-format", "strata")
    ]
    assert key["env"] == engine["env"] and env(key)["VLLM_USE_AOT_COMPILE"] == "0"
    assert key["resources"] == ENGINE["resources"]
    assert {"model-llama", PACKAGES_VOLUME, KEY_VOLUME} <= set(mounts(key))
    assert mounts(key)[KEY_VOLUME].get("readOnly") is None


@pytest.mark.parametrize(
    ("container", "args"),
    [
        ({"command": ["vllm", "serve", "/m", "--dtype", "half"]}, ["--model", "/m", "--dtype", "half"]),
        ({"command": ["vllm"], "args": ["serve", "--model", "/m"]}, ["--model", "/m"]),
        ({"command": ["python3", "-m", "vllm.entrypoints.openai.api_server", "--model=/m"]}, ["--model=/m"]),
        ({"args": ["python3.12", "-m", "vllm.entrypoints.cli.main", "serve", "/m"]}, ["--model", "/m"]),
    ],
)
def test_the_engines_vllm_arguments_in_the_form_the_key_reads(container: dict[str, Any], args: list[str]) -> None:
    assert engine_vllm_args(container) == args


def test_every_added_container_keeps_the_restricted_defaults() -> None:
    init = inits(wired(pod()))
    for name in (KEY_CONTAINER, RESTORE_CONTAINER, CAPTURE_CONTAINER):
        security = init[name]["securityContext"]
        assert security["allowPrivilegeEscalation"] is False and security["runAsNonRoot"] is True
        assert security["capabilities"] == {"drop": ["ALL"]}
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    assert init[RESTORE_CONTAINER]["securityContext"]["readOnlyRootFilesystem"] is True
    assert init[CAPTURE_CONTAINER]["securityContext"]["readOnlyRootFilesystem"] is True
    assert init[CAPTURE_CONTAINER]["securityContext"]["runAsUser"] == 65532  # who wrote the model's files
    # Importing vLLM writes caches: the key's root filesystem is as writable as the engine's.
    assert init[KEY_CONTAINER]["securityContext"]["readOnlyRootFilesystem"] is False


def test_the_restore_runs_as_the_engines_user() -> None:
    engine = {**ENGINE, "securityContext": {"runAsUser": 1001, "runAsGroup": 1001}}
    restore = inits(wired(pod(engine)))[RESTORE_CONTAINER]
    assert (restore["securityContext"]["runAsUser"], restore["securityContext"]["runAsGroup"]) == (1001, 1001)


def test_a_cache_without_compile_cache_or_a_pod_that_opts_out_gets_none_of_it() -> None:
    plain = wired(pod(), cache())
    opted_out = wired(pod(annotations={COMPILE_CACHE_ANNOTATION: "false"}))
    for out in (plain, opted_out):
        assert KEY_CONTAINER not in inits(out) and CAPTURE_CONTAINER not in inits(out)
        assert "VLLM_CACHE_ROOT" not in env(out["spec"]["containers"][0])


def test_a_pod_with_two_vllm_engines_is_refused_naming_them() -> None:
    other = {**ENGINE, "name": "vllm-b"}
    with pytest.raises(WiringConflict, match=r"one vLLM engine per pod; this pod runs 2 \(vllm, vllm-b\)"):
        patch(pod(ENGINE, other))


def test_a_cache_root_of_the_users_own_is_a_conflict_naming_the_field() -> None:
    engine = {**ENGINE, "env": [{"name": "VLLM_CACHE_ROOT", "value": "/cache"}]}
    with pytest.raises(WiringConflict, match=r"spec\.containers\[vllm\]\.env\[VLLM_CACHE_ROOT\] is already set"):
        patch(pod(engine))


def test_admitting_the_wired_pod_again_changes_nothing() -> None:
    once = wired(pod())
    assert patch(once) == []
    for container in [*once["spec"]["initContainers"], *once["spec"]["containers"]]:
        container.setdefault("imagePullPolicy", "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
    assert patch(once) == []


def test_the_store_goes_with_the_models_own_clean_up() -> None:
    """No clean-up of its own: the store is inside what deleting the cache removes. NodeLocal: the directory the
    cleanup Job's `rm -rf` removes holds it; SharedPVC: it is on the claim the cache owns (garbage-collected with
    it under deletionPolicy Delete; an adopted claim, like the model on it, is kept)."""
    import posixpath

    from strata_operator.api.modelcache import ModelCacheSpec
    from strata_operator.resources.modelcache import storage
    from strata_operator.resources.modelcache.jobs import NODE_ROOT_MOUNT
    from strata_operator.resources.modelcache.owner import CacheRef

    owner = CacheRef("llama", "serving", "u1")
    body = compiling_cache("NodeLocal")
    store = {v["name"]: v for v in wired(pod(), body)["spec"]["volumes"]}[STORE_VOLUME]
    job = storage.node_cleanup(owner, ModelCacheSpec.model_validate(body["spec"]), "n1")
    template = job["spec"]["template"]["spec"]
    (root,) = [v["hostPath"]["path"] for v in template["volumes"] if "hostPath" in v]
    (removed,) = [a.split("'")[1] for a in template["containers"][0]["args"] if a.startswith("rm -rf")]
    assert posixpath.join(root, posixpath.relpath(removed, NODE_ROOT_MOUNT)) == store["hostPath"]["path"]

    body = compiling_cache("SharedPVC")
    store = {v["name"]: v for v in wired(pod(), body)["spec"]["volumes"]}[STORE_VOLUME]
    claim = storage.build_claim(owner, ModelCacheSpec.model_validate(body["spec"]))
    assert store["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
    assert claim["metadata"]["ownerReferences"][0]["uid"] == "u1"
