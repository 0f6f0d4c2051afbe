"""ModelCache on the real node, run by the operator the chart installed as a pod: a preloader Job's container
really copies a model from S3 into a claim that really bound, the operator reads its termination message,
and a consumer pod that pastes `status.volume` reads every tensor bit for bit, as does a pod that only carries
the `strata.dev/model-cache` label (the admission webhook wires it; created before the cache is Ready, it waits at
the scheduling gate until it is). Bad credentials end Degraded
with the loader's own one-line reason, and nothing half-written is marked Ready."""

from __future__ import annotations

import os
import time

import pytest
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import NODE_NAME, WORK_DIR
from strata_testsupport.pods import (
    API,
    RUNTIME_UID,
    cache_status,
    condition,
    model_cache,
    read_model_in_pod,
    s3_model_spec,
    s3_secret,
    static_volume,
    unique,
    upload_model,
    wait_phase,
)
from strata_testsupport.realnode import held_storage
from strata_testsupport.scenarios import (
    consumer_reads_every_tensor,
    gated_pod_waits_for_the_cache_then_reads,
    labelled_pod_reads_every_tensor,
    preload_from_s3,
)

pytestmark = [pytest.mark.integration, pytest.mark.realnode]


def test_shared_pvc_cache_preloads_from_s3_and_a_consumer_reads_every_tensor(node_site, node_s3):
    name, bucket = unique("tiny"), node_s3.create_bucket()
    digests = upload_model(node_s3, bucket, "tiny")
    started = time.monotonic()
    status = preload_from_s3(node_site, name, f"s3://{bucket}/tiny")
    print(f"apply -> Ready: {time.monotonic() - started:.1f}s")
    assert status["totalFiles"] == 3  # two safetensors files and config.json
    claim = resource(node_site.client, "v1", "PersistentVolumeClaim").get(
        name=status["claimName"], namespace=node_site.namespace
    )
    assert claim.spec.volumeName == f"{node_site.namespace}-{name}-model", "the static volume on the node"
    consumer_reads_every_tensor(node_site, status, digests)
    wired = labelled_pod_reads_every_tensor(node_site, name, digests)
    (container,) = wired["spec"]["containers"]
    assert {"name": "STRATA_MODEL_DIR", "value": status["volume"]["volumeMount"]["mountPath"]} in container["env"]
    assert status["volume"]["volume"] in wired["spec"]["volumes"], "the webhook added the cache's own volume"


def test_a_pod_created_before_its_cache_is_ready_waits_at_the_gate_then_starts_and_reads(node_site, node_s3):
    name, bucket = unique("gated"), node_s3.create_bucket()
    digests = upload_model(node_s3, bucket, "tiny")
    site = held_storage(node_site)  # the cache turns Ready only after the gate states were seen

    def release() -> None:
        static_volume(site.client, site.namespace, f"{name}-model")

    gated_pod_waits_for_the_cache_then_reads(site, name, f"s3://{bucket}/tiny", digests, release)


def test_wrong_s3_credentials_end_degraded_with_the_loaders_reason(
    node_k8s, node_operator, node_s3_checking_credentials, restricted_namespace
):
    node_s3 = node_s3_checking_credentials
    namespace, name = restricted_namespace, unique("bad")
    bucket = node_s3.create_bucket()
    upload_model(node_s3, bucket, "tiny", files=1)
    s3_secret(node_k8s, namespace, "wrong", "not-a-key", "not-a-secret")
    path = static_volume(node_k8s, namespace, f"{name}-model")
    spec = s3_model_spec(node_s3, bucket, "tiny", "wrong")
    spec["preload"]["backoffLimit"] = 0
    model_cache(node_k8s, namespace, name, spec)

    status = wait_phase(node_k8s, namespace, name, {"Ready", "Degraded", "Failed"})
    assert status["phase"] in ("Degraded", "Failed"), status
    degraded = condition(status, "Degraded")
    assert degraded["status"] == "True", status
    message = degraded["message"]
    print(f"Degraded: {message}")
    assert "InvalidAccessKeyId" in message or "403" in message or "denied" in message.lower(), message
    assert "\n" not in message and "Traceback" not in message
    assert condition(status, "Ready").get("status") != "True"
    assert not (path / ".strata-manifest.json").exists(), "a failed copy must never look complete"
    assert cache_status(node_k8s, namespace, name)["phase"] != "Ready"


def test_node_local_copy_lands_on_the_node_is_labelled_and_is_removed_with_the_cache(
    node_k8s, node_operator, node_s3, privileged_namespace
):
    namespace, name = privileged_namespace, unique("local")
    bucket = node_s3.create_bucket()
    digests = upload_model(node_s3, bucket, "tiny", files=1)
    s3_secret(node_k8s, namespace, "s3", node_s3.access_key, node_s3.secret_key)
    root = WORK_DIR / "models"
    root.mkdir(parents=True, exist_ok=True)
    os.chown(root, RUNTIME_UID, RUNTIME_UID)
    spec = s3_model_spec(node_s3, bucket, "tiny", "s3")
    spec["storage"] = {
        "mode": "NodeLocal",
        "nodeLocal": {"path": str(root), "nodeSelector": {"kubernetes.io/hostname": NODE_NAME}},
    }
    model_cache(node_k8s, namespace, name, spec)

    status = wait_phase(node_k8s, namespace, name, {"Ready", "Degraded", "Failed"})
    assert status["phase"] == "Ready", status
    copy = root / namespace / name
    assert sorted(p.name for p in copy.iterdir() if not p.name.startswith(".")) == [
        "config.json",
        "model-00001-of-00001.safetensors",
    ]
    label = status["nodeLabel"] if "nodeLabel" in status else next(iter(status["volume"]["nodeSelector"]))
    node = resource(node_k8s, "v1", "Node").get(name=NODE_NAME)
    assert node.metadata.labels[label] == "Ready"

    snippet = status["volume"]
    assert read_model_in_pod(node_k8s, namespace, "consumer", snippet, nodeSelector=snippet["nodeSelector"]) == digests

    resource(node_k8s, API, "ModelCache").delete(name=name, namespace=namespace)
    wait_for(
        lambda: not resource(node_k8s, API, "ModelCache").get(namespace=namespace).items,
        timeout=180,
        interval=1,
        what="the cache to be deleted after its clean-up Job",
    )
    assert not copy.exists(), "the clean-up Job removes the node's copy"
    assert label not in (resource(node_k8s, "v1", "Node").get(name=NODE_NAME).metadata.labels or {})
