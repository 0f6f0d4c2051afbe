"""Strata's vLLM packages given to a vLLM container at admission (webhook.vllm_packages): the volume, the copy from
the runtime image, the read-only mount first on PYTHONPATH, the version check in the engine's own image, and what
the pod can say (opt out, opt in, declared versions). Pure: plain dicts through `build_pod_patch`."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
from strata_loader.vllm import support
from strata_operator.resources.runtime_image import RuntimeImage
from strata_operator.webhook import admission
from strata_operator.webhook.vllm_command import engine_python
from strata_operator.webhook.vllm_packages import (
    CHECK_PREFIX,
    COPY_CONTAINER,
    INJECT_ANNOTATION,
    PACKAGES_PATH,
    PACKAGES_VOLUME,
    PYTHON_VERSION_ANNOTATION,
    RUNTIME_PACKAGES_DIR,
    VLLM_VERSION_ANNOTATION,
    check_name,
)
from strata_operator.webhook.wiring import WiringConflict, build_pod_patch

from .test_serving_wiring import apply_patch, cache, tier

RUNTIME = RuntimeImage("registry.local/strata-runtime:1.2.3", "Always", ("regcred",))
ENGINE = {
    "name": "vllm",
    "image": "vllm/vllm-openai:v0.33.0",
    "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
}
SIDECAR = {"name": "proxy", "image": "envoy", "command": ["envoy"]}
MOUNT = {"name": PACKAGES_VOLUME, "mountPath": PACKAGES_PATH, "readOnly": True}
CHECK = f"{PACKAGES_PATH}/strata_loader/vllm/support.py"
RESTRICTED = {
    "allowPrivilegeEscalation": False,
    "privileged": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    labels = {"strata.dev/model-cache": "llama", "strata.dev/kv-cache-tier": "kv"}
    return {
        "metadata": {"name": "p", "labels": labels, "annotations": annotations or {}},
        "spec": {"containers": [dict(c) for c in containers or (ENGINE, SIDECAR)], **spec},
    }


def patch(p: dict[str, Any], runtime: RuntimeImage = RUNTIME) -> list[dict[str, Any]]:
    return build_pod_patch(p, model_cache=cache(), kv_tier=tier(), runtime=runtime)


def wired(p: dict[str, Any]) -> dict[str, Any]:
    return apply_patch(p, patch(p))


def init(out: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in out["spec"].get("initContainers") or []}


def env(container: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container.get("env") or []}


def test_a_vllm_container_gets_the_packages_copied_from_the_runtime_image() -> None:
    out = wired(pod())
    spec = out["spec"]
    assert {"name": PACKAGES_VOLUME, "emptyDir": {"sizeLimit": "64Mi"}} in spec["volumes"]
    copy = init(out)[COPY_CONTAINER]
    assert copy == {
        "name": COPY_CONTAINER,
        "image": "registry.local/strata-runtime:1.2.3",
        "imagePullPolicy": "Always",
        "command": ["cp", "-R", f"{RUNTIME_PACKAGES_DIR}/.", PACKAGES_PATH],
        "resources": {"requests": {"cpu": "10m", "memory": "32Mi"}, "limits": {"cpu": "1", "memory": "256Mi"}},
        "securityContext": {**RESTRICTED, "runAsUser": 65532, "runAsGroup": 65532},
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [{"name": PACKAGES_VOLUME, "mountPath": PACKAGES_PATH}],
    }
    assert {"name": "regcred"} in spec["imagePullSecrets"], "the runtime image's pull Secret"
    engine = spec["containers"][0]
    assert MOUNT in engine["volumeMounts"]
    assert env(engine)["PYTHONPATH"] == PACKAGES_PATH
    assert "--load-format" in engine["args"], "the rest of the wiring is unchanged"


def test_the_version_check_runs_in_the_engines_image_before_it_starts() -> None:
    out = wired(pod())
    names = [c["name"] for c in out["spec"]["initContainers"]]
    assert names == [COPY_CONTAINER, f"{CHECK_PREFIX}vllm"], "copied first, then checked"
    check = init(out)[f"{CHECK_PREFIX}vllm"]
    assert check["image"] == ENGINE["image"]
    assert check["command"] == ["python3", "-I", CHECK]
    assert check["volumeMounts"] == [MOUNT]
    assert check["terminationMessagePolicy"] == "FallbackToLogsOnError", "the check's message shows in the status"
    assert check["securityContext"] == {**RESTRICTED, "runAsUser": 65532}, "non-root even if the image's user is root"
    assert check["resources"]["limits"] == {"cpu": "1", "memory": "256Mi"}
    # The pod had no PYTHONPATH: the engine's replaces the image's, so the check says if the image set one.
    assert check["env"] == [{"name": support.PACKAGES_PYTHONPATH_ENV, "value": PACKAGES_PATH}]
    assert check["envFrom"] == out["spec"]["containers"][0]["envFrom"], "it sees what the engine's envFrom sets"


def test_each_pod_gets_its_own_objects() -> None:
    """Nothing of the module's constants is shared into a pod, where a later edit would change every pod's."""
    out = build_pod_patch(pod(), model_cache=cache(), kv_tier=tier(), runtime=RUNTIME)
    (init_op,) = [op for op in out if op["path"] == "/spec/initContainers"]
    copy, check = init_op["value"]
    copy["resources"]["limits"]["memory"] = "1Gi"
    assert check["resources"]["limits"]["memory"] == "256Mi"
    assert wired(pod())["spec"]["initContainers"][0]["resources"]["limits"]["memory"] == "256Mi"


def test_the_check_script_is_where_the_copied_directory_has_it() -> None:
    from strata_loader.vllm.packages import CHECK_SCRIPT

    assert f"{PACKAGES_PATH}/{CHECK_SCRIPT}" == CHECK


def test_a_sidecar_that_does_not_run_vllm_is_untouched() -> None:
    out = wired(pod())
    sidecar = out["spec"]["containers"][1]
    assert MOUNT not in sidecar.get("volumeMounts", [])
    assert "PYTHONPATH" not in env(sidecar)
    assert not [c for c in out["spec"]["initContainers"] if c["name"].endswith("proxy")]


def test_admitting_the_wired_pod_again_changes_nothing() -> None:
    for p in (
        pod(),
        pod({**ENGINE, "env": [{"name": "PYTHONPATH", "value": "/app"}]}),
        pod({**ENGINE, "envFrom": [{"configMapRef": {"name": "settings"}}]}),
    ):
        once = wired(p)
        assert patch(once) == []


def test_a_pod_as_the_api_server_stored_it_is_admitted_unchanged() -> None:
    """Stored containers carry defaults the webhook never wrote (`kubectl get pod -o yaml | kubectl create`)."""
    stored = wired(pod())
    for container in [*stored["spec"]["initContainers"], *stored["spec"]["containers"]]:
        container.setdefault("imagePullPolicy", "IfNotPresent")
        container.setdefault("terminationMessagePath", "/dev/termination-log")
        # The ServiceAccount admission plugin mounts the API token into every container, init ones too.
        token = {"name": "kube-api-access-x1", "readOnly": True, "mountPath": "/var/run/secrets/kubernetes.io/sa"}
        container.setdefault("volumeMounts", []).append(token)
    assert patch(stored) == []
    stored["spec"]["initContainers"][0]["volumeMounts"] = [stored["spec"]["initContainers"][0]["volumeMounts"][-1]]
    with pytest.raises(WiringConflict, match=r"spec\.initContainers\[strata-vllm-packages\] is already set"):
        patch(stored)
    stored = wired(pod())
    stored["spec"]["initContainers"][1]["command"] = ["python3", "-c", "pass"]
    with pytest.raises(WiringConflict, match=r"spec\.initContainers\[strata-check-vllm\] is already set"):
        patch(stored)


def test_the_users_pythonpath_follows_the_packages() -> None:
    out = wired(pod({**ENGINE, "env": [{"name": "PYTHONPATH", "value": "/app:/lib"}]}))
    engine = out["spec"]["containers"][0]
    assert env(engine)["PYTHONPATH"] == f"{PACKAGES_PATH}:/app:/lib"
    assert [e["name"] for e in engine["env"]].count("PYTHONPATH") == 1
    check = init(out)[f"{CHECK_PREFIX}vllm"]
    assert "env" not in check, "the pod chose its PYTHONPATH: nothing of the image's to lose"


def test_a_pythonpath_from_value_from_is_refused_naming_the_field() -> None:
    p = pod({**ENGINE, "env": [{"name": "PYTHONPATH", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]})
    with pytest.raises(WiringConflict, match=r"spec\.containers\[vllm\]\.env\[PYTHONPATH\] is set from valueFrom"):
        patch(p)


def test_the_annotation_false_opts_out() -> None:
    out = wired(pod(annotations={INJECT_ANNOTATION: "false"}))
    assert "initContainers" not in out["spec"]
    assert PACKAGES_VOLUME not in {v["name"] for v in out["spec"]["volumes"]}
    assert "PYTHONPATH" not in env(out["spec"]["containers"][0])
    assert "--load-format" in out["spec"]["containers"][0]["args"], "the image's own Strata serves it"


def test_the_annotation_true_gives_every_wired_container_the_packages() -> None:
    """An image whose entrypoint runs vLLM (the pod sets only args) is not recognised as vLLM by its command."""
    args_only = {"name": "engine", "image": "vllm/vllm-openai:v0.33.0", "args": ["--port", "8000"]}
    out = wired(pod(args_only, annotations={INJECT_ANNOTATION: "true", "strata.dev/containers": "engine"}))
    assert env(out["spec"]["containers"][0])["PYTHONPATH"] == PACKAGES_PATH
    assert f"{CHECK_PREFIX}engine" in init(out)
    assert "strata.dev/containers" in out["metadata"]["annotations"]
    assert wired(pod(args_only))["spec"].get("initContainers") is None, "not vLLM by its command: nothing"


def test_an_unknown_annotation_value_is_refused() -> None:
    with pytest.raises(WiringConflict, match=r"strata.dev/inject-packages is 'yes': use \"true\""):
        patch(pod(annotations={INJECT_ANNOTATION: "yes"}))


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({VLLM_VERSION_ANNOTATION: "0.31.2"}, "vLLM 0.31.2 is not supported by Strata's vLLM packages"),
        ({PYTHON_VERSION_ANNOTATION: "3.10"}, "Python 3.10 is not supported by Strata's vLLM packages"),
        ({VLLM_VERSION_ANNOTATION: "0.33.0", PYTHON_VERSION_ANNOTATION: "3.9.18"}, "Python 3.9.18 is not supported"),
        ({VLLM_VERSION_ANNOTATION: "nightly"}, "vLLM nightly is not supported"),
    ],
)
def test_a_declared_version_that_is_not_served_is_refused_at_admission(
    annotations: dict[str, str], message: str
) -> None:
    with pytest.raises(WiringConflict, match=message) as refused:
        patch(pod(annotations=annotations))
    assert "they serve Python 3.11, 3.12, 3.13 and vLLM 0.32, 0.33" in str(refused.value)
    assert 'strata.dev/inject-packages: "false"' in str(refused.value)


def test_declared_versions_do_not_matter_when_the_pod_opts_out() -> None:
    assert patch(pod(annotations={INJECT_ANNOTATION: "false", VLLM_VERSION_ANNOTATION: "0.20.0"}))


def test_with_both_versions_declared_and_served_no_check_runs_at_start() -> None:
    both = {VLLM_VERSION_ANNOTATION: "0.33.0", PYTHON_VERSION_ANNOTATION: "3.12"}
    assert list(init(wired(pod(annotations=both)))) == [COPY_CONTAINER]
    only_vllm = {VLLM_VERSION_ANNOTATION: "0.32.0"}
    assert list(init(wired(pod(annotations=only_vllm)))) == [COPY_CONTAINER, f"{CHECK_PREFIX}vllm"]


def test_the_users_init_containers_run_first_and_a_clashing_one_is_refused() -> None:
    mine = {"name": "download", "image": "busybox"}
    out = wired(pod(initContainers=[mine]))
    assert [c["name"] for c in out["spec"]["initContainers"]] == ["download", COPY_CONTAINER, f"{CHECK_PREFIX}vllm"]
    clash = {"name": COPY_CONTAINER, "image": "mine"}
    with pytest.raises(WiringConflict, match=r"spec\.initContainers\[strata-vllm-packages\] is already set"):
        patch(pod(initContainers=[clash]))


def test_a_mount_at_the_packages_path_is_refused() -> None:
    p = pod({**ENGINE, "volumeMounts": [{"name": "mine", "mountPath": PACKAGES_PATH}]})
    with pytest.raises(WiringConflict, match=r"spec\.containers\[vllm\]\.volumeMounts already has"):
        patch(p)


def test_the_check_runs_as_the_engines_user_where_the_pod_names_one() -> None:
    own = {**ENGINE, "securityContext": {"runAsUser": 1000, "runAsGroup": 2000}}
    check = init(wired(pod(own)))[f"{CHECK_PREFIX}vllm"]
    assert check["securityContext"]["runAsUser"] == 1000 and check["securityContext"]["runAsGroup"] == 2000
    check = init(wired(pod(securityContext={"runAsUser": 3000})))[f"{CHECK_PREFIX}vllm"]
    assert "runAsUser" not in check["securityContext"], "the pod's user applies to it as to the engine"
    assert check["securityContext"]["runAsNonRoot"] is True
    root = {**ENGINE, "securityContext": {"runAsUser": 0}}
    assert init(wired(pod(root)))[f"{CHECK_PREFIX}vllm"]["securityContext"]["runAsUser"] == 65532


@pytest.mark.parametrize(
    ("container", "python"),
    [
        ({"command": ["python3.12", "-m", "vllm.entrypoints.openai.api_server"]}, "python3.12"),
        ({"command": ["/opt/venv/bin/python", "-m", "vllm.entrypoints.cli.main", "serve"]}, "/opt/venv/bin/python"),
        ({"command": ["/opt/venv/bin/vllm", "serve"]}, "/opt/venv/bin/python3"),
        ({"command": ["vllm"], "args": ["serve"]}, "python3"),
        ({"args": ["--port", "8000"]}, "python3"),
    ],
)
def test_the_check_uses_the_interpreter_that_runs_vllm(container: dict[str, Any], python: str) -> None:
    assert engine_python(container) == python


def test_check_names_fit_a_container_name() -> None:
    assert check_name("vllm") == "strata-check-vllm"
    long = check_name("x" * 60)
    assert len(long) <= 63 and long.startswith(CHECK_PREFIX) and long == check_name("x" * 60)


def test_the_admission_response_carries_the_injection_and_refuses_an_unserved_version() -> None:
    objects = {("ModelCache", "llama"): cache(), ("KVCacheTier", "kv"): tier()}

    def lookup(kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        return objects.get((kind, name))

    request = {"uid": "1", "kind": {"kind": "Pod"}, "operation": "CREATE", "namespace": "serving", "object": pod()}
    answer = admission.decide(request, lookup, RUNTIME)
    ops = json.loads(base64.b64decode(answer["patch"]))
    init_op = next(op for op in ops if op["path"] == "/spec/initContainers")
    assert init_op["value"][0]["image"] == RUNTIME.image
    refused = admission.decide(
        {**request, "object": pod(annotations={VLLM_VERSION_ANNOTATION: "0.30.0"})}, lookup, RUNTIME
    )
    assert refused["allowed"] is False
    assert "annotation strata.dev/vllm-version: vLLM 0.30.0 is not supported" in refused["status"]["message"]
