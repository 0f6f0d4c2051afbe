"""ImageVolume against a real registry (distribution's, HTTPS with a throwaway CA, basic auth): the operator
resolves the tag to a digest with the cache's pull Secret and CA bundle, keeps it while the tag moves, resolves
again when asked, and ends Degraded with the registry's reason when the pull is denied or the image is missing.
Pre-pulls run per selected node on fake nodes (the real pull is the real-node tier's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from strata_loader.pack import Reference, RegistryClient, pack, push_image
from strata_operator.api import API_VERSION
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.registry import Registry

from .test_modelcache_support import (
    Heartbeat,
    cache_jobs,
    condition,
    create_cache,
    finish_job,
    get_cache,
    unique,
    wait_for_status,
)

pytestmark = pytest.mark.integration


def push(registry: Registry, tmp_path: Path, repository: str, tag: str, config: bytes) -> tuple[str, int]:
    """Pack a small model (its config.json given) and push it; (the index digest, the layer bytes)."""
    model = tmp_path / unique("model")
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " + bytes(range(256)) * 8192)
    (model / "config.json").write_bytes(config)
    image = pack(model)
    assert registry.ca_file is not None
    with RegistryClient(
        registry.address, ca_file=registry.ca_file, username=registry.username, password=registry.password
    ) as client:
        push_image(image, Reference.parse(registry.reference(repository, tag)), client)
    return image.digest, image.layer_bytes


def credentials(k8s: DynamicClient, namespace: str, registry: Registry, password: str | None = None) -> str:
    name = unique("regcred")
    resource(k8s, "v1", "Secret").create(namespace=namespace, body=registry.pull_secret(name, password))
    return name


def trust(k8s: DynamicClient, namespace: str, registry: Registry) -> str:
    name = unique("registry-ca")
    resource(k8s, "v1", "ConfigMap").create(namespace=namespace, body=registry.ca_config_map(name))
    return name


def image_cache(
    k8s: DynamicClient, namespace: str, registry: Registry, reference: str, secret: str | None, **volume: Any
) -> str:
    name = unique("mc")
    settings: dict[str, Any] = {"caConfigMapRef": {"name": trust(k8s, namespace, registry)}, **volume}
    if secret is not None:
        settings["pullSecretRef"] = {"name": secret}
    spec = {"source": {"uri": f"oci://{reference}"}, "storage": {"mode": "ImageVolume", "imageVolume": settings}}
    create_cache(k8s, namespace, name, spec)
    return name


def test_the_tag_is_pinned_to_its_digest_until_a_new_resolution_is_asked(
    k8s: DynamicClient, operator: Any, namespace: str, registry_with_auth: Registry, tmp_path: Path
) -> None:
    registry = registry_with_auth
    repository = f"models/{unique('pinned')}"
    first, size = push(registry, tmp_path, repository, "v1", b'{"n": 1}')
    secret = credentials(k8s, namespace, registry)
    name = image_cache(k8s, namespace, registry, registry.reference(repository, "v1"), secret)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "phase Ready")
    pinned = f"{registry.address}/{repository}@{first}"
    assert status["image"]["digest"] == first and status["image"]["reference"] == pinned
    assert status["image"]["sizeBytes"] == size == status["totalBytes"]
    assert status["volume"]["volume"]["image"]["reference"] == pinned
    assert status["volume"]["imagePullSecrets"] == [{"name": secret}]

    moved, _ = push(registry, tmp_path, repository, "v1", b'{"n": 2}')  # the tag moves: nodes keep the pin
    assert moved != first
    resource(k8s, API_VERSION, "ModelCache").patch(
        name=name,
        namespace=namespace,
        body={"spec": {"mountPath": "/model"}},
        content_type="application/merge-patch+json",
    )
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("observedGeneration") == 2, "the spec change seen")
    assert status["image"]["digest"] == first

    resource(k8s, API_VERSION, "ModelCache").patch(
        name=name,
        namespace=namespace,
        body={"metadata": {"annotations": {"strata.dev/resolve-image": "now"}}},
        content_type="application/merge-patch+json",
    )
    status = wait_for_status(k8s, namespace, name, lambda s: s["image"].get("digest") == moved, "the new digest")
    assert status["volume"]["volume"]["image"]["reference"] == f"{registry.address}/{repository}@{moved}"


@pytest.mark.parametrize(
    ("case", "reason", "said"),
    [
        ("wrong password", "ImagePullDenied", "refused the credentials"),
        ("no secret", "ImagePullDenied", "requires credentials"),
        ("missing tag", "ImageNotFound", "MANIFEST_UNKNOWN"),
        ("unknown digest", "ImageNotFound", "404"),
    ],
)
def test_a_pull_the_registry_refuses_ends_degraded_with_its_reason(
    k8s: DynamicClient,
    operator: Any,
    namespace: str,
    registry_with_auth: Registry,
    tmp_path: Path,
    case: str,
    reason: str,
    said: str,
) -> None:
    registry = registry_with_auth
    repository = f"models/{unique('refused')}"
    push(registry, tmp_path, repository, "v1", b"{}")
    reference = registry.reference(repository, "v1")
    secret: str | None = credentials(k8s, namespace, registry)
    if case == "wrong password":
        secret = credentials(k8s, namespace, registry, password="not-the-password")
    elif case == "no secret":
        secret = None
    elif case == "missing tag":
        reference = registry.reference(repository, "v404")
    else:
        reference = f"{registry.address}/{repository}@sha256:{'0' * 64}"
    name = image_cache(k8s, namespace, registry, reference, secret)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Degraded", "phase Degraded")
    degraded = condition(get_cache(k8s, namespace, name), "Degraded")
    assert degraded["reason"] == reason and said in degraded["message"], degraded
    assert "volume" not in status and status["image"]["failures"] >= 1
    assert condition(get_cache(k8s, namespace, name), "Ready")["status"] == "False"


def test_pre_pulls_mount_the_digest_on_each_selected_node_and_label_it(
    k8s: DynamicClient, operator: Any, namespace: str, registry_with_auth: Registry, tmp_path: Path, nodes: Heartbeat
) -> None:
    registry = registry_with_auth
    repository = f"models/{unique('prepull')}"
    digest, _ = push(registry, tmp_path, repository, "v1", b"{}")
    pool = {"strata-test/pool": unique("pool")}
    node = nodes.add(unique("gpu"), pool)
    secret = credentials(k8s, namespace, registry)
    reference = registry.reference(repository, "v1")
    name = image_cache(k8s, namespace, registry, reference, secret, prePull=True, nodeSelector=pool)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 1, "one pre-pull")
    assert status["phase"] == "Ready" and status["nodes"][0]["name"] == node
    job = cache_jobs(k8s, namespace, name, "prepull")[0]
    pod = job["spec"]["template"]["spec"]
    assert {"name": "model", "image": status["volume"]["volume"]["image"]} in pod["volumes"]
    assert status["volume"]["volume"]["image"]["reference"].endswith(f"@{digest}")
    assert {"name": secret} in pod["imagePullSecrets"]
    finish_job(k8s, namespace, job["metadata"]["name"], None)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("readyNodes") == 1, "the image pulled")
    assert condition(get_cache(k8s, namespace, name), "Reconciling")["status"] == "False"
    labels = resource(k8s, "v1", "Node").get(name=node).to_dict()["metadata"]["labels"]
    assert labels[status["nodeLabel"]] == "Ready"

    resource(k8s, API_VERSION, "ModelCache").delete(name=name, namespace=namespace)

    def unlabelled() -> bool:
        labels = resource(k8s, "v1", "Node").get(name=node).to_dict()["metadata"]["labels"]
        return status["nodeLabel"] not in labels

    wait_for(unlabelled, timeout=30, what="the node label removed with the cache")
