"""Helpers for the real-node tests: pods run to completion with their logs, static volumes on the node, models
generated and uploaded to the S3 server pods reach, ModelCaches waited on."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from kubernetes.client import CoreV1Api
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ApiException
from strata_operator.resources.security import container_security_context

from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import NODE_NAME, WORK_DIR
from strata_testsupport.models import safetensors_model

API = "strata.dev/v1alpha1"
RUNTIME_IMAGE = "ghcr.io/strata-dev/strata-runtime:0.1.0"
RUNTIME_UID = 65532
STATIC_CLASS = "strata-node-static"
# What the operator renders for its own pods, with the runtime image's user made explicit.
RESTRICTED_CONTAINER = {**container_security_context(), "runAsUser": RUNTIME_UID}


def admission_refusal(client: DynamicClient, namespace: str, pod: dict[str, Any], *, dry_run: bool = False) -> str:
    """ "" when the API server admits `pod` (created, or only admitted with `dry_run`), else its refusal's message.
    Admission policies reach the API server through a watch: tests that switch one on or off wait on this."""
    params = [("dryRun", "All")] if dry_run else []
    try:
        resource(client, "v1", "Pod").create(namespace=namespace, body=pod, query_params=params)
    except ApiException as error:
        if error.status != 403:
            raise
        return str(json.loads(error.body)["message"])
    return ""


# Run inside a consumer pod from the runtime image (no torch there): every tensor's bytes through Strata's own
# safetensors parser, hashed, so the test compares them with the source bit for bit.
TENSOR_DIGESTS = """
import hashlib, json, os, sys
from strata_loader.core.format import parse_header, parse_header_size
root, digests = sys.argv[1], {}
for name in sorted(os.listdir(root)):
    if not name.endswith(".safetensors"):
        continue
    data = open(os.path.join(root, name), "rb").read()
    size = parse_header_size(data[:8], len(data))
    header = parse_header(data[8 : 8 + size], len(data))
    for t in header.tensors:
        start = header.data_offset + t.start
        digests[t.name] = hashlib.sha256(data[start : start + t.nbytes]).hexdigest()
print(json.dumps(digests))
"""


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def pod_log(client: DynamicClient, namespace: str, name: str, container: str | None = None) -> str:
    # Raw bytes: the client would parse a log that looks like JSON into a dict.
    kwargs = {"container": container} if container else {}
    raw = CoreV1Api(client.client).read_namespaced_pod_log(
        name=name, namespace=namespace, _preload_content=False, **kwargs
    )
    return str(raw.data.decode())


def run_pod(
    client: DynamicClient,
    namespace: str,
    name: str,
    command: list[str],
    *,
    timeout: float = 180,
    image: str = RUNTIME_IMAGE,
    labels: dict[str, str] | None = None,
    **spec: Any,
) -> str:
    """Run one restricted container from the runtime image to completion; return its log, fail with its state.
    `labels` go on the pod (the admission webhook's opt-in labels, for instance)."""
    containers = [
        {
            "name": "main",
            "image": image,
            "imagePullPolicy": "IfNotPresent",
            "command": command,
            "securityContext": RESTRICTED_CONTAINER,
            **spec.pop("container", {}),
        }
    ]
    pods = resource(client, "v1", "Pod")
    pods.create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}},
            "spec": {"restartPolicy": "Never", "containers": containers, **spec},
        },
    )

    def finished() -> str | None:
        phase = pods.get(name=name, namespace=namespace).status.phase
        return str(phase) if phase in ("Succeeded", "Failed") else None

    phase = wait_for(finished, timeout=timeout, interval=0.5, what=f"pod {name} to finish")
    text = pod_log(client, namespace, name)
    if phase != "Succeeded":
        state = pods.get(name=name, namespace=namespace).to_dict()["status"].get("containerStatuses")
        raise AssertionError(f"pod {name} {phase}: {state}\n{text}")
    return text


def static_volume(client: DynamicClient, namespace: str, claim: str, size: str = "1Gi") -> Path:
    """A ReadWriteMany PersistentVolume on the node, pre-bound to `claim`: the claim binds for real through the
    PV controller. Its directory is under the node's work dir (swept), owned by the runtime image's user."""
    resource(client, "storage.k8s.io/v1", "StorageClass").server_side_apply(
        body={
            "apiVersion": "storage.k8s.io/v1",
            "kind": "StorageClass",
            "metadata": {"name": STATIC_CLASS},
            "provisioner": "kubernetes.io/no-provisioner",
            "volumeBindingMode": "Immediate",
            "reclaimPolicy": "Retain",
        },
        name=STATIC_CLASS,
        field_manager="strata-realnode-tests",
    )
    path = WORK_DIR / "volumes" / f"{namespace}-{claim}"
    path.mkdir(parents=True, exist_ok=True)
    os.chown(path, RUNTIME_UID, RUNTIME_UID)
    resource(client, "v1", "PersistentVolume").create(
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": f"{namespace}-{claim}"},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": ["ReadWriteMany"],
                "storageClassName": STATIC_CLASS,
                "persistentVolumeReclaimPolicy": "Retain",
                "claimRef": {"namespace": namespace, "name": claim},
                "hostPath": {"path": str(path), "type": "Directory"},
                "nodeAffinity": {
                    "required": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {"key": "kubernetes.io/hostname", "operator": "In", "values": [NODE_NAME]}
                                ]
                            }
                        ]
                    }
                },
            },
        }
    )
    return path


def upload_model(s3: Any, bucket: str, prefix: str, files: int = 2, tensor_bytes: int = 1 << 20) -> dict[str, str]:
    """A small generated safetensors model (several dtypes) in S3; returns each tensor's sha256."""
    contents, digests = safetensors_model(files, tensor_bytes)
    client = s3.client()
    for name, data in contents.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)
    return digests


def s3_secret(client: DynamicClient, namespace: str, name: str, access_key: str, secret_key: str) -> None:
    resource(client, "v1", "Secret").create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "stringData": {"AWS_ACCESS_KEY_ID": access_key, "AWS_SECRET_ACCESS_KEY": secret_key},
        },
    )


def model_cache(client: DynamicClient, namespace: str, name: str, spec: dict[str, Any]) -> None:
    resource(client, API, "ModelCache").create(
        namespace=namespace, body={"apiVersion": API, "kind": "ModelCache", "metadata": {"name": name}, "spec": spec}
    )


def cache_status(client: DynamicClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(resource(client, API, "ModelCache").get(name=name, namespace=namespace).to_dict().get("status") or {})


def condition(status: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c["type"] == kind), {})


def wait_phase(client: DynamicClient, namespace: str, name: str, phases: set[str], timeout: float = 240) -> dict:
    """Wait until the cache's phase is one of `phases`; the failure message carries the last status."""
    deadline = time.monotonic() + timeout
    status: dict[str, Any] = {}
    while time.monotonic() < deadline:
        status = cache_status(client, namespace, name)
        if status.get("phase") in phases:
            return status
        time.sleep(1)
    raise AssertionError(f"ModelCache {namespace}/{name} not in {phases} after {timeout:.0f}s: {status}")


TOKEN = "a-token-of-more-than-sixteen-bytes"

# Run in a client pod: the connection ConfigMap's URL, the token from the Secret, chunks written or read back. A
# server pod is Ready before kube-proxy routes its Service to it (the EndpointSlice, then the node's rules), so the
# client connects as engines do: refused connections are retried for a while.
KV_CLIENT = """
import hashlib, json, os, sys, time, urllib.parse
from strata_kv.client import KVClient
url = urllib.parse.urlparse(os.environ["STRATA_KV_URL"])
mode, count = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 60
while True:
    try:
        kv = KVClient(url.hostname, url.port, token=os.environ["KV_TOKEN"], timeout=20)
        kv.ping()
        break
    except ConnectionRefusedError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
with kv:
    result = {"host": url.hostname}
    for i in range(count):
        key = f"chunk-{i:04d}".encode()
        value = hashlib.sha256(key).digest() * 8192  # 256 KiB
        if mode == "write":
            kv.set(key, value)
        else:
            result[key.decode()] = kv.get(key) == value
print(json.dumps(result))
"""


def kv_tier_spec(claim: str) -> dict[str, Any]:
    """A small tier pinned to the real node: 64 MiB of L1 before an L2 on an existing RWX claim, with auth."""
    return {
        "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
        "l1": {"size": "64Mi"},
        "l2": {"fs": {"pvc": {"claimName": claim}, "capacity": "512Mi"}},
        "auth": {"secretRef": {"name": "kv-token", "key": "token"}},
        "resources": {"requests": {"cpu": "50m"}},
    }


def rwx_claim(client: DynamicClient, namespace: str, name: str, size: str = "1Gi") -> Path:
    """A ReadWriteMany claim bound to its own static volume on the node (see `static_volume`); its directory."""
    path = static_volume(client, namespace, name, size)
    resource(client, "v1", "PersistentVolumeClaim").create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": name},
            "spec": {
                "accessModes": ["ReadWriteMany"],
                "storageClassName": STATIC_CLASS,
                "resources": {"requests": {"storage": size}},
            },
        },
    )
    return path


def kv_token_secret(client: DynamicClient, namespace: str) -> None:
    resource(client, "v1", "Secret").create(
        namespace=namespace,
        body={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kv-token"}, "stringData": {"token": TOKEN}},
    )


def kv_client_pod(
    client: DynamicClient, namespace: str, tier: str, name: str, mode: str, count: int, **spec: Any
) -> dict:
    """Run KV_CLIENT in a pod that takes the tier's connection ConfigMap with envFrom; its JSON result."""
    out = run_pod(
        client,
        namespace,
        name,
        ["python", "-c", KV_CLIENT, mode, str(count)],
        **spec,
        container={
            "envFrom": [{"configMapRef": {"name": f"{tier}-connection"}}],
            "env": [{"name": "KV_TOKEN", "valueFrom": {"secretKeyRef": {"name": "kv-token", "key": "token"}}}],
        },
    )
    return dict(json.loads(out.strip().splitlines()[-1]))


def s3_model_spec(s3: Any, bucket: str, prefix: str, secret: str, size: str = "1Gi") -> dict[str, Any]:
    """A SharedPVC ModelCache of `s3://bucket/prefix` into a claim of the node's static class, checksums verified."""
    return {
        "source": {
            "uri": f"s3://{bucket}/{prefix}",
            "credentials": {"secretRef": {"name": secret}},
            "s3": {"endpoint": s3.endpoint_url, "region": s3.region},
        },
        "storage": {"mode": "SharedPVC", "sharedPVC": {"size": size, "storageClassName": STATIC_CLASS}},
        "preload": {"verify": "checksums"},
    }


def read_model_in_pod(
    client: DynamicClient, namespace: str, name: str, snippet: dict[str, Any], **spec: Any
) -> dict[str, str]:
    """A consumer pod that pastes a cache's `status.volume` and hashes every tensor (TENSOR_DIGESTS)."""
    volume, mount = snippet["volume"], snippet["volumeMount"]
    out = run_pod(
        client,
        namespace,
        name,
        ["python", "-c", TENSOR_DIGESTS, mount["mountPath"]],
        volumes=[volume],
        container={"volumeMounts": [mount]},
        timeout=300,
        **spec,
    )
    return dict(json.loads(out.strip().splitlines()[-1]))
