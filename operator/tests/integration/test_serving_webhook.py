"""The pod admission webhook called by the real kube-apiserver over TLS on loopback: Deployments' pods come out
wired, unlabelled pods never reach it, a stopped webhook fails only labelled pods, wiring twice changes nothing,
and conflicts are refused with the field named."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ApiException
from strata_operator.api import API_VERSION
from strata_operator.resources.runtime_image import default_runtime
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.webhook import RunningWebhook

from .test_modelcache_support import create_cache, fetch_result, finish_job, unique, wait_for_status

pytestmark = pytest.mark.integration
SOURCE = "s3://models/llama-3-8b"


def ready_shared_cache(k8s: DynamicClient, namespace: str, **more_spec: Any) -> str:
    name = unique("llama")
    spec = {"source": {"uri": SOURCE}, "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}}}
    create_cache(k8s, namespace, name, {**spec, **more_spec})
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("job"), "a preloader Job")
    finish_job(k8s, namespace, status["job"], fetch_result(SOURCE))
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "phase Ready")
    return name


def kv_tier(k8s: DynamicClient, namespace: str, spec: dict[str, Any] | None = None) -> str:
    name = unique("kv")
    body = {"apiVersion": API_VERSION, "kind": "KVCacheTier", "metadata": {"name": name}, "spec": spec or {}}
    resource(k8s, API_VERSION, "KVCacheTier").create(body=body, namespace=namespace)
    return name


def pod_body(name: str, labels: dict[str, str], **container: Any) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [{"name": "vllm", "image": "vllm/vllm-openai:latest", **container}]},
    }


def refusal(error: ApiException) -> str:
    return str(json.loads(error.body)["message"])


def create_pod(k8s: DynamicClient, namespace: str, body: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    return dict(resource(k8s, "v1", "Pod").create(body=body, namespace=namespace, **kwargs).to_dict())


def test_deployment_pods_come_out_wired(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    cache, tier = ready_shared_cache(k8s, namespace), kv_tier(k8s, namespace)
    labels = {"app": "vllm", "strata.dev/model-cache": cache, "strata.dev/kv-cache-tier": tier}
    template = pod_body("unused", labels)
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "vllm"},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "vllm"}},
            "template": {"metadata": {"labels": labels}, "spec": template["spec"]},
        },
    }
    resource(k8s, "apps/v1", "Deployment").create(body=deployment, namespace=namespace)

    def pods() -> list[dict[str, Any]] | None:
        found = resource(k8s, "v1", "Pod").get(namespace=namespace, label_selector="app=vllm").to_dict()["items"]
        return found if len(found) == 2 else None

    for pod in wait_for(pods, timeout=60, what="the Deployment's two pods"):
        spec = pod["spec"]
        volume = next(v for v in spec["volumes"] if v["name"] == f"model-{cache}")
        assert volume["persistentVolumeClaim"] == {"claimName": f"{cache}-model", "readOnly": True}
        (vllm,) = spec["containers"]
        # Wired to a KV tier too: the model path (the engine's model name, which keys its KV) names the revision,
        # here the copy's manifest digest (fetch_result's).
        model_dir = "/models/rev-" + "5e" * 6
        assert {"name": f"model-{cache}", "mountPath": model_dir, "readOnly": True} in vllm["volumeMounts"]
        assert {"name": "STRATA_MODEL_DIR", "value": model_dir} in vllm["env"]
        assert pod["metadata"]["annotations"]["strata.dev/model-revision"] == "5e" * 6
        assert vllm["envFrom"] == [{"configMapRef": {"name": f"{tier}-connection"}}]
        assert not spec.get("schedulingGates"), "the cache is Ready: no gate"


def test_unlabelled_pods_are_never_sent_and_survive_a_stopped_webhook(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    cache = ready_shared_cache(k8s, namespace)
    before = pod_webhook.requests
    create_pod(k8s, namespace, pod_body("plain", {"app": "other"}))
    assert pod_webhook.requests == before, "an unlabelled pod reached the webhook"
    create_pod(k8s, namespace, pod_body("wired", {"strata.dev/model-cache": cache}))
    assert pod_webhook.requests == before + 1
    both = {"strata.dev/model-cache": cache, "strata.dev/kv-cache-tier": kv_tier(k8s, namespace)}
    wired = create_pod(k8s, namespace, pod_body("both", both))
    assert pod_webhook.requests == before + 2, "a pod with both labels is sent once"
    assert wired["spec"]["containers"][0]["envFrom"] == [
        {"configMapRef": {"name": f"{both['strata.dev/kv-cache-tier']}-connection"}}
    ]

    pod_webhook.stop()
    try:
        create_pod(k8s, namespace, pod_body("plain-2", {"app": "other"}))
        with pytest.raises(ApiException) as refused:
            create_pod(k8s, namespace, pod_body("wired-2", {"strata.dev/model-cache": cache}))
        assert refused.value.status == 500
        message = refusal(refused.value)
        assert 'failed calling webhook "model-cache.pods.strata.dev"' in message and "connection refused" in message
    finally:
        pod_webhook.start()
    create_pod(k8s, namespace, pod_body("wired-3", {"strata.dev/model-cache": cache}))


def test_a_pod_wired_twice_is_unchanged(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    cache, tier = ready_shared_cache(k8s, namespace), kv_tier(k8s, namespace)
    labels = {"strata.dev/model-cache": cache, "strata.dev/kv-cache-tier": tier}
    first = create_pod(k8s, namespace, pod_body("first", labels, args=["serve"]))
    again = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "again", "labels": first["metadata"]["labels"]},
        "spec": copy.deepcopy(first["spec"]),
    }
    second = create_pod(k8s, namespace, again, dry_run="All")
    assert second["spec"]["volumes"] == first["spec"]["volumes"]
    assert second["spec"]["containers"] == first["spec"]["containers"]


def test_a_restricted_pod_wired_to_a_node_socket_is_admitted_under_restricted_pod_security(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    """The node socket's inline CSI volume and supplemental group pass the API server's own `restricted` Pod
    Security check, which runs after the webhook's mutation: the socket needs no hostPath and no privilege."""
    patch = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    resource(k8s, "v1", "Namespace").patch(body=patch, name=namespace, content_type="application/merge-patch+json")
    tier = kv_tier(k8s, namespace, {"nodeSocket": {"enabled": True}})
    body = pod_body(
        "restricted",
        {"strata.dev/kv-cache-tier": tier},
        securityContext={
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
    )
    stored = create_pod(k8s, namespace, body)["spec"]
    volume = next(v for v in stored["volumes"] if v["name"] == "strata-kv-socket")
    assert volume["csi"] == {"driver": "kv.strata.dev", "readOnly": True, "volumeAttributes": {"tier": tier}}
    (vllm,) = stored["containers"]
    assert {"name": "strata-kv-socket", "mountPath": "/run/strata-kv", "readOnly": True} in vllm["volumeMounts"]
    assert stored["securityContext"]["supplementalGroups"] == [65532]


def test_a_vllm_pod_gets_stratas_packages_under_restricted_pod_security(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    """The init containers that copy Strata's vLLM packages from the runtime image and check the engine image's
    versions pass the API server's own `restricted` check; the stored pod admitted again comes out the same (its
    defaults filled in); a declared vLLM the packages do not serve is refused by name."""
    patch = {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}
    resource(k8s, "v1", "Namespace").patch(body=patch, name=namespace, content_type="application/merge-patch+json")
    restricted = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    labels = {"strata.dev/kv-cache-tier": kv_tier(k8s, namespace)}
    body = pod_body("engine", labels, command=["vllm", "serve"], securityContext=restricted)
    stored = create_pod(k8s, namespace, body)
    init = stored["spec"]["initContainers"]
    assert [c["name"] for c in init] == ["strata-vllm-packages", "strata-check-vllm"]
    assert init[0]["image"] == default_runtime().image and init[1]["image"] == "vllm/vllm-openai:latest"
    (vllm,) = stored["spec"]["containers"]
    assert {"name": "PYTHONPATH", "value": "/strata/vllm-packages"} in vllm["env"]
    assert {"name": "strata-vllm-packages", "mountPath": "/strata/vllm-packages", "readOnly": True} in vllm[
        "volumeMounts"
    ]
    again = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "again", "labels": labels}}
    second = create_pod(k8s, namespace, again | {"spec": copy.deepcopy(stored["spec"])}, dry_run="All")
    assert second["spec"]["initContainers"] == init and second["spec"]["containers"] == stored["spec"]["containers"]

    old = pod_body("old", labels, command=["vllm", "serve"], securityContext=restricted)
    old["metadata"]["annotations"] = {"strata.dev/vllm-version": "0.31.0"}
    with pytest.raises(ApiException) as refused:
        create_pod(k8s, namespace, old)
    assert "annotation strata.dev/vllm-version: vLLM 0.31.0 is not supported" in refusal(refused.value)


def test_conflicts_and_missing_caches_are_refused_by_name(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    cache = ready_shared_cache(k8s, namespace)
    env = [{"name": "STRATA_MODEL_DIR", "value": "/elsewhere"}]
    with pytest.raises(ApiException) as conflict:
        create_pod(k8s, namespace, pod_body("mine", {"strata.dev/model-cache": cache}, env=env))
    assert conflict.value.status == 403
    assert "spec.containers[vllm].env[STRATA_MODEL_DIR] is already set" in refusal(conflict.value)
    with pytest.raises(ApiException) as missing:
        create_pod(k8s, namespace, pod_body("typo", {"strata.dev/model-cache": "no-such-cache"}))
    assert "ModelCache 'no-such-cache' (label strata.dev/model-cache) does not exist" in refusal(missing.value)


def test_vllm_containers_get_their_flags_and_others_are_left_alone(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    """Through the API server's admission: each vLLM command form gets the model, `--load-format strata` and the
    KV flags of its engine (the tier's, or GPU for a container that requests one); a sidecar is untouched; a
    model the user wrote that is not the cache's is refused with the field named; the opt-out adds nothing."""
    cache, tier = ready_shared_cache(k8s, namespace), kv_tier(k8s, namespace, {"connector": {"engine": "cpu"}})
    labels = {"strata.dev/model-cache": cache, "strata.dev/kv-cache-tier": tier}
    kv = ["--prefix-caching-hash-algo", "$(PREFIX_CACHING_HASH_ALGO)"]
    body = pod_body("serve", labels, command=["vllm", "serve"], args=["--enforce-eager"])
    body["spec"]["containers"].append({"name": "proxy", "image": "envoy", "args": ["-c", "/etc/envoy.yaml"]})
    serve = create_pod(k8s, namespace, body)["spec"]["containers"]
    assert serve[0]["args"] == [
        "$(STRATA_MODEL_DIR)",
        "--enforce-eager",
        *("--load-format", "strata", "--kv-transfer-config", "$(KV_TRANSFER_CONFIG)", *kv),
    ]
    assert serve[1]["args"] == ["-c", "/etc/envoy.yaml"], "a container that does not run vLLM is left alone"

    gpu = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
    module = pod_body("module", labels, command=["python3", "-m", "vllm.entrypoints.openai.api_server"], resources=gpu)
    assert create_pod(k8s, namespace, module)["spec"]["containers"][0]["args"] == [
        *("--model", "$(STRATA_MODEL_DIR)", "--load-format", "strata"),
        *("--kv-transfer-config", "$(KV_TRANSFER_CONFIG_GPU)", *kv),
    ]

    with pytest.raises(ApiException) as refused:
        create_pod(k8s, namespace, pod_body("theirs", labels, command=["vllm", "serve"], args=["facebook/opt-125m"]))
    assert refused.value.status == 403
    assert "spec.containers[vllm] runs vLLM with model 'facebook/opt-125m'" in refusal(refused.value)

    out = pod_body("out", labels, command=["vllm", "serve"], args=["facebook/opt-125m"])
    out["metadata"]["annotations"] = {"strata.dev/vllm-args": "false"}
    assert create_pod(k8s, namespace, out)["spec"]["containers"][0]["args"] == ["facebook/opt-125m"]


SAMPLES = Path(__file__).resolve().parents[3] / "samples"
HASH_ALGO = ["--prefix-caching-hash-algo", "$(PREFIX_CACHING_HASH_ALGO)"]
SERVING_SAMPLES = sorted(SAMPLES.glob("vllm-*.yaml"))


def sample(name: str) -> dict[str, dict[str, Any]]:
    return {doc["kind"]: doc for doc in yaml.safe_load_all((SAMPLES / name).read_text()) if doc}


@pytest.mark.parametrize("path", SERVING_SAMPLES, ids=[p.name for p in SERVING_SAMPLES])
def test_serving_samples_are_accepted_and_their_pods_admitted_wired(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook, path: Path
) -> None:
    """The Deployments and Services in samples/ as a user applies them; their pod template, labelled with a Ready
    cache and the CPU sample's tier (or a default one), comes out of admission with the flags Strata adds."""
    docs = sample(path.name)
    cpu = "cpu" in path.name
    tier_doc = sample("kvcachetier-cpu.yaml")
    for kind, version in (("Secret", "v1"), ("KVCacheTier", API_VERSION)):
        resource(k8s, version, kind).create(body=tier_doc[kind], namespace=namespace, dry_run="All")
    cache = ready_shared_cache(k8s, namespace)
    tier = kv_tier(k8s, namespace, tier_doc["KVCacheTier"]["spec"] if cpu else None)
    for kind, version in (("Deployment", "apps/v1"), ("Service", "v1")):
        resource(k8s, version, kind).create(body=docs[kind], namespace=namespace, dry_run="All")
    template = copy.deepcopy(docs["Deployment"]["spec"]["template"])
    template["metadata"]["labels"] |= {"strata.dev/model-cache": cache, "strata.dev/kv-cache-tier": tier}
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "sample", **template["metadata"]}}
    (vllm,) = create_pod(k8s, namespace, body | {"spec": template["spec"]}, dry_run="All")["spec"]["containers"]
    config = "$(KV_TRANSFER_CONFIG)" if cpu else "$(KV_TRANSFER_CONFIG_GPU)"
    assert "$(STRATA_MODEL_DIR)" in vllm["args"]
    assert vllm["args"][-6:] == ["--load-format", "strata", "--kv-transfer-config", config, *HASH_ALGO]
