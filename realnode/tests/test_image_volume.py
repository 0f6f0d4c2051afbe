"""A model packed by `strata-loader pack`, pushed to the registry on the node's address, mounted by a real pod as
a Kubernetes image volume (`spec.volumes[].image`) through containerd 2: every tensor and every file reads back
bit for bit, through the whole image and through a subPath; the pull needs the pod's pull secret."""

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
from strata_testsupport.pods import RESTRICTED_CONTAINER, RUNTIME_IMAGE, TENSOR_DIGESTS, run_pod, unique

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

# Appended to TENSOR_DIGESTS (which printed the tensors' digests): every file's digest, whether the volume can be
# written, and what the whole image holds (mounted at /image), on a second line.
FILE_DIGESTS = """
files = {}
for directory, _, names in os.walk(root):
    for name in names:
        path = os.path.join(directory, name)
        files[os.path.relpath(path, root)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
try:
    open(os.path.join(root, "written-by-the-pod"), "w")
    writable = True
except OSError:
    writable = False
print(json.dumps({"files": files, "writable": writable, "image_root": sorted(os.listdir("/image"))}))
"""


def push(registry: Any, source: Path, tag: str) -> dict[str, Any]:
    env = {**os.environ, "STRATA_REGISTRY_PASSWORD": registry.password}
    argv = [sys.executable, "-m", "strata_loader.cli", "pack", str(source)]
    argv += ["--to", registry.reference("models/tiny", tag), *registry.pack_args()]
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    return dict(json.loads(result.stdout))


def pull_secret(client: Any, namespace: str, registry: Any) -> str:
    auth = base64.b64encode(f"{registry.username}:{registry.password}".encode()).decode()
    config = {"auths": {registry.address: {"auth": auth}}}
    resource(client, "v1", "Secret").create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "registry-credentials"},
            "type": "kubernetes.io/dockerconfigjson",
            "stringData": {".dockerconfigjson": json.dumps(config)},
        },
    )
    return "registry-credentials"


def image_volume(reference: str) -> dict[str, Any]:
    return {"name": "model", "image": {"reference": reference, "pullPolicy": "IfNotPresent"}}


def pull_failure(client: Any, namespace: str, name: str) -> str:
    """The reason and message the kubelet reports while it cannot pull a pod's image volume ('' until then)."""
    pod = resource(client, "v1", "Pod").get(name=name, namespace=namespace).to_dict()
    for status in pod.get("status", {}).get("containerStatuses") or []:
        waiting = (status.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff"):
            return f"{waiting['reason']}: {waiting.get('message', '')}"
    events = resource(client, "v1", "Event").get(namespace=namespace).to_dict()["items"]
    failed = [e for e in events if e["involvedObject"].get("name") == name and e.get("reason") == "Failed"]
    return "; ".join(e.get("message", "") for e in failed)


def test_the_node_runs_containerd_2(node_k8s):
    node = resource(node_k8s, "v1", "Node").get(name=NODE_NAME).to_dict()
    version = node["status"]["nodeInfo"]["containerRuntimeVersion"]
    major, minor = (int(x) for x in version.removeprefix("containerd://").lstrip("v").split(".")[:2])
    assert (major, minor) >= (2, 2), version


def test_a_packed_model_mounts_as_an_image_volume_and_reads_bit_for_bit(
    node_k8s, node_registry, restricted_namespace, tmp_path
):
    contents, tensors = safetensors_model(files=2, tensor_bytes=1 << 20)
    contents["tokenizer/special_tokens.json"] = b'{"bos": "<s>"}'
    for name, data in contents.items():
        (tmp_path / "model" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "model" / name).write_bytes(data)
    summary = push(node_registry, tmp_path / "model", "v1")
    assert len(summary["layers"]) == 3  # two weight files, then the small ones together

    # Without the pull secret the registry refuses the node, and the kubelet says so.
    denied = unique("no-secret")
    resource(node_k8s, "v1", "Pod").create(
        namespace=restricted_namespace,
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": denied},
            "spec": {
                "restartPolicy": "Never",
                "containers": [{"name": "main", "image": RUNTIME_IMAGE, "securityContext": RESTRICTED_CONTAINER}],
                "volumes": [image_volume(summary["reference"])],
            },
        },
    )
    failure = wait_for(lambda: pull_failure(node_k8s, restricted_namespace, denied), timeout=120, what="a pull error")
    assert "authorization failed: no basic auth credentials" in failure, failure
    print(json.dumps({"denied pull": failure}))

    secret = pull_secret(node_k8s, restricted_namespace, node_registry)
    out = run_pod(
        node_k8s,
        restricted_namespace,
        unique("image-volume"),
        ["python", "-c", TENSOR_DIGESTS + FILE_DIGESTS, "/model"],
        volumes=[image_volume(summary["reference"])],
        imagePullSecrets=[{"name": secret}],
        container={
            "volumeMounts": [
                {"name": "model", "mountPath": "/model", "subPath": "models"},
                {"name": "model", "mountPath": "/image"},
            ]
        },
        timeout=300,
    )
    read_tensors, read_files = (json.loads(line) for line in out.strip().splitlines()[-2:])
    assert read_tensors == tensors
    assert read_files["files"] == {name: hashlib.sha256(data).hexdigest() for name, data in contents.items()}
    assert read_files["writable"] is False
    assert read_files["image_root"] == ["models"]  # the whole image: the files under one directory
