"""ModelCache `ImageVolume` on the real node, run by the operator the chart installed as a pod: a generated model
packed and pushed to the registry on the node's address, the cache resolves its tag to the digest, pre-pulls it
through containerd 2 and labels the node; a pod the webhook wires reads every tensor and file bit for bit; a
second tag that changes only config.json uploads one small layer. A reference the registry does not have and a
pull it denies end Degraded with the registry's or the runtime's reason, and deleting the cache leaves none of the
Jobs, pods or node labels Strata made."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import NODE_NAME
from strata_testsupport.models import safetensors_model
from strata_testsupport.pods import (
    API,
    TENSOR_DIGESTS,
    cache_status,
    condition,
    model_cache,
    run_pod,
    unique,
    wait_phase,
)

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

FILE_DIGESTS = """
files = {}
for directory, _, names in os.walk(root):
    for name in names:
        path = os.path.join(directory, name)
        files[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
print(json.dumps(files))
"""
"""Appended to TENSOR_DIGESTS: every file's digest, on a second line."""


def write_model(directory: Path, config: bytes | None = None) -> tuple[dict[str, bytes], dict[str, str]]:
    contents, tensors = safetensors_model(files=2, tensor_bytes=1 << 20)
    if config is not None:
        contents["config.json"] = config
    for name, data in contents.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        (directory / name).write_bytes(data)
    return contents, tensors


def push(registry: Any, source: Path, repository: str, tag: str) -> dict[str, Any]:
    """`strata-loader pack SRC --to ...` as a user runs it; its JSON summary."""
    env = {**os.environ, "STRATA_REGISTRY_PASSWORD": registry.password}
    argv = [sys.executable, "-m", "strata_loader.cli", "pack", str(source)]
    argv += ["--to", registry.reference(repository, tag), *registry.pack_args()]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def pull_secret(client: Any, namespace: str, registry: Any, password: str | None = None) -> str:
    name = unique("regcred")
    resource(client, "v1", "Secret").create(namespace=namespace, body=registry.pull_secret(name, password))
    return name


def registry_ca(client: Any, namespace: str, registry: Any) -> str:
    name = unique("registry-ca")
    resource(client, "v1", "ConfigMap").create(namespace=namespace, body=registry.ca_config_map(name))
    return name


def image_spec(registry: Any, reference: str, ca: str, secret: str | None, **volume: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {"caConfigMapRef": {"name": ca}, **volume}
    if secret is not None:
        settings["pullSecretRef"] = {"name": secret}
    return {"source": {"uri": f"oci://{reference}"}, "storage": {"mode": "ImageVolume", "imageVolume": settings}}


def strata_leftovers(client: Any, namespace: str, name: str, label: str) -> list[str]:
    """Jobs, pods and node labels of this cache still there."""
    selector = f"strata.dev/modelcache={name}"
    left = [f"Job {j['metadata']['name']}" for j in resource(client, "batch/v1", "Job").get(
        namespace=namespace, label_selector=selector).to_dict()["items"]]  # fmt: skip
    pods = resource(client, "v1", "Pod").get(namespace=namespace, label_selector=selector).to_dict()["items"]
    left += [f"Pod {p['metadata']['name']}" for p in pods]
    labels = resource(client, "v1", "Node").get(name=NODE_NAME).to_dict()["metadata"].get("labels") or {}
    left += [f"node label {label}"] if label in labels else []
    return left


def test_an_image_volume_cache_pins_pre_pulls_serves_every_tensor_and_leaves_nothing(
    node_k8s, node_operator, node_registry, restricted_namespace, tmp_path
):
    namespace, name, repository = restricted_namespace, unique("image"), f"models/{unique('tiny')}"
    contents, tensors = write_model(tmp_path / "v1")
    summary = push(node_registry, tmp_path / "v1", repository, "v1")
    secret, ca = pull_secret(node_k8s, namespace, node_registry), registry_ca(node_k8s, namespace, node_registry)
    spec = image_spec(
        node_registry,
        node_registry.reference(repository, "v1"),
        ca,
        secret,
        prePull=True,
        nodeSelector={"kubernetes.io/hostname": NODE_NAME},
    )
    model_cache(node_k8s, namespace, name, spec)
    status = wait_for(
        lambda: (s := cache_status(node_k8s, namespace, name)).get("readyNodes") == 1 and s,
        timeout=240,
        what="the image pre-pulled on the node",
    )
    print(json.dumps({"status.image": status["image"], "nodes": status["nodes"]}))
    pinned = f"{node_registry.address}/{repository}@{summary['digest']}"
    assert status["phase"] == "Ready" and status["image"]["reference"] == pinned
    assert status["image"]["sizeBytes"] == sum(layer["size"] for layer in summary["layers"]) == summary["bytes"]
    assert status["volume"]["volume"]["image"]["reference"] == pinned
    label = status["nodeLabel"]
    node = resource(node_k8s, "v1", "Node").get(name=NODE_NAME).to_dict()
    assert node["metadata"]["labels"][label] == "Ready"

    # A pod that only carries the label: the webhook adds the pinned volume, its mount and the pull Secret.
    reader = unique("reader")
    out = run_pod(
        node_k8s,
        namespace,
        reader,
        ["python", "-c", TENSOR_DIGESTS + FILE_DIGESTS, f"{status['volume']['volumeMount']['mountPath']}/models"],
        labels={"strata.dev/model-cache": name},
        timeout=240,
    )
    read_tensors, read_files = (json.loads(line) for line in out.strip().splitlines()[-2:])
    assert read_tensors == tensors
    assert read_files == {n: hashlib.sha256(d).hexdigest() for n, d in contents.items()}
    wired = resource(node_k8s, "v1", "Pod").get(name=reader, namespace=namespace).to_dict()
    assert wired["spec"]["imagePullSecrets"] == [{"name": secret}]
    assert status["volume"]["volume"] in wired["spec"]["volumes"]

    # A second tag, only config.json changed: one small layer and the configs go up, the weights are there.
    (tmp_path / "v2").mkdir()
    for path in (tmp_path / "v1").rglob("*"):
        if path.is_file():
            (tmp_path / "v2" / path.relative_to(tmp_path / "v1")).write_bytes(path.read_bytes())
    (tmp_path / "v2" / "config.json").write_bytes(b'{"architectures": ["Tiny"], "revision": 2}')
    second = push(node_registry, tmp_path / "v2", repository, "v2")
    print(json.dumps({"v1 push": summary["uploaded"], "v2 push": second["uploaded"], "present": second["present"]}))
    changed = [layer for layer in second["layers"] if layer["digest"] not in {x["digest"] for x in summary["layers"]}]
    assert len(changed) == 1 and changed[0]["size"] < 64 << 10, changed
    assert second["present"]["blobs"] == len(summary["layers"]) - 1  # every weight layer was there
    assert second["uploaded"]["bytes"] < 64 << 10

    resource(node_k8s, API, "ModelCache").delete(name=name, namespace=namespace)
    wait_for(lambda: not strata_leftovers(node_k8s, namespace, name, label), timeout=120, what="nothing left")
    assert resource(node_k8s, API, "ModelCache").get(namespace=namespace).to_dict()["items"] == []


def test_a_reference_the_registry_lacks_ends_degraded_with_its_reason(
    node_k8s, node_operator, node_registry, restricted_namespace
):
    namespace, name = restricted_namespace, unique("missing")
    secret, ca = pull_secret(node_k8s, namespace, node_registry), registry_ca(node_k8s, namespace, node_registry)
    reference = node_registry.reference(f"models/{unique('absent')}", "v1")
    model_cache(node_k8s, namespace, name, image_spec(node_registry, reference, ca, secret))
    status = wait_phase(node_k8s, namespace, name, {"Ready", "Degraded"})
    degraded = condition(status, "Degraded")
    print(json.dumps({"missing image": degraded}))
    assert status["phase"] == "Degraded" and degraded["reason"] == "ImageNotFound", status
    assert "404" in degraded["message"], degraded
    assert "NAME_UNKNOWN" in degraded["message"] or "MANIFEST_UNKNOWN" in degraded["message"], degraded


def test_a_denied_pull_ends_degraded_with_the_registrys_and_the_runtimes_reason(
    node_k8s, node_operator, node_registry, restricted_namespace, tmp_path
):
    namespace = restricted_namespace
    repository = f"models/{unique('denied')}"  # a repository no node pulled: containerd has to ask
    write_model(tmp_path / "m", config=b'{"denied": true}')  # another digest than the other tests' images
    push(node_registry, tmp_path / "m", repository, "v1")
    reference = node_registry.reference(repository, "v1")
    ca = registry_ca(node_k8s, namespace, node_registry)

    # The operator itself is refused: no digest, no volume, Degraded with the registry's words.
    anonymous = unique("anonymous")
    model_cache(node_k8s, namespace, anonymous, image_spec(node_registry, reference, ca, None))
    status = wait_phase(node_k8s, namespace, anonymous, {"Ready", "Degraded"})
    degraded = condition(status, "Degraded")
    print(json.dumps({"denied resolution": degraded}))
    assert status["phase"] == "Degraded" and degraded["reason"] == "ImagePullDenied", status
    assert "requires credentials" in degraded["message"] and "volume" not in status

    # The node is refused: the digest is pinned with good credentials, then the Secret goes bad before the
    # pre-pull; the kubelet's pull error is the node's state and the cache's Degraded reason.
    name = unique("prepull-denied")
    secret = pull_secret(node_k8s, namespace, node_registry)
    model_cache(node_k8s, namespace, name, image_spec(node_registry, reference, ca, secret))
    wait_phase(node_k8s, namespace, name, {"Ready"})
    wrong = base64.b64encode(f"{node_registry.username}:not-the-password".encode()).decode()
    config = json.dumps({"auths": {node_registry.address: {"auth": wrong}}})
    resource(node_k8s, "v1", "Secret").patch(
        name=secret, namespace=namespace, body={"stringData": {".dockerconfigjson": config}}
    )
    selector = {"kubernetes.io/hostname": NODE_NAME}
    resource(node_k8s, API, "ModelCache").patch(
        name=name,
        namespace=namespace,
        body={"spec": {"storage": {"imageVolume": {"prePull": True, "nodeSelector": selector}}}},
        content_type="application/merge-patch+json",
    )
    status = wait_phase(node_k8s, namespace, name, {"Degraded"})
    degraded = condition(status, "Degraded")
    print(json.dumps({"denied pre-pull": degraded, "node": status["nodes"]}))
    assert degraded["reason"] == "PrePullFailed", status
    assert status["nodes"][0]["phase"] == "Failed"
    message = status["nodes"][0]["message"]
    assert message.startswith(("ErrImagePull", "ImagePullBackOff")), message
    assert any(word in message for word in ("401", "nauthorized", "authoriz")), message
    assert status["image"]["digest"] and condition(status, "Ready")["status"] == "True"  # the pin is still good
