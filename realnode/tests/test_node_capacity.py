"""Node budgets on the real node: a NodeCachePolicy over a small tmpfs node path, preloader Jobs that really
measure it (statvfs) and really evict the least recently used idle copy, a pinned cache that is never evicted,
and a copy that cannot fit ending InsufficientStorage with the numbers. The operator runs as a pod from its image
with only the chart's RBAC."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import NODE_NAME, WORK_DIR
from strata_testsupport.pods import (
    API,
    RUNTIME_UID,
    cache_status,
    condition,
    model_cache,
    s3_model_spec,
    s3_secret,
    unique,
    upload_model,
    wait_phase,
)

pytestmark = [pytest.mark.integration, pytest.mark.realnode]
MiB = 2**20


@pytest.fixture
def small_node_path() -> Iterator[Path]:
    """A 12 MiB tmpfs as the node path: two ~4 MiB models fit under 80%, a third does not."""
    root = WORK_DIR / unique("budget")
    root.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=12m,mode=0755", "tmpfs", str(root)], check=True)
    os.chown(root, RUNTIME_UID, RUNTIME_UID)
    try:
        yield root
    finally:
        subprocess.run(["umount", "-l", str(root)], check=False)
        root.rmdir()


@pytest.fixture
def budget(node_k8s, small_node_path: Path) -> Iterator[str]:
    name = unique("ncp")
    policies = resource(node_k8s, API, "NodeCachePolicy")
    policies.create(
        body={
            "apiVersion": API,
            "kind": "NodeCachePolicy",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                "path": str(small_node_path),
                "highWatermark": 80,
                "lowWatermark": 50,
            },
        }
    )
    yield name
    policies.delete(name=name)


def used_and_free(path: Path) -> tuple[int, int]:
    st = os.statvfs(path)
    return (st.f_blocks - st.f_bfree) * st.f_frsize, st.f_bavail * st.f_frsize


def test_lru_idle_copy_is_evicted_pinned_never_and_a_copy_that_cannot_fit_says_why(
    node_k8s, node_operator, node_s3, privileged_namespace, small_node_path, budget
):
    namespace = privileged_namespace
    s3_secret(node_k8s, namespace, "s3", node_s3.access_key, node_s3.secret_key)
    bucket = node_s3.create_bucket()

    def cache(prefix: str, *, pinned: bool = False) -> str:
        name = unique(prefix)
        upload_model(node_s3, bucket, name, files=1, tensor_bytes=2 * MiB)  # about 4 MiB
        spec = s3_model_spec(node_s3, bucket, name, "s3")
        spec["storage"] = {
            "mode": "NodeLocal",
            "nodeLocal": {
                "path": str(small_node_path),
                "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                "pinned": pinned,
            },
        }
        model_cache(node_k8s, namespace, name, spec)
        return name

    idle = cache("idle")
    assert wait_phase(node_k8s, namespace, idle, {"Ready", "Degraded", "Failed"})["phase"] == "Ready"
    pinned = cache("pinned", pinned=True)
    assert wait_phase(node_k8s, namespace, pinned, {"Ready", "Degraded", "Failed"})["phase"] == "Ready"

    new = cache("new")
    status = wait_phase(node_k8s, namespace, new, {"Ready", "Degraded", "Failed"})
    assert status["phase"] == "Ready", status
    (state,) = status["nodes"]
    assert state["evicted"] == [f"{namespace}/{idle}"] and state["policy"] == budget
    assert (state["usedBytes"], state["freeBytes"]) == used_and_free(small_node_path)
    assert not (small_node_path / namespace / idle).exists()
    assert (small_node_path / namespace / pinned / ".strata-manifest.json").is_file()

    label = cache_status(node_k8s, namespace, idle)["nodeLabel"]
    wait_for(
        lambda: resource(node_k8s, "v1", "Node").get(name=NODE_NAME).metadata.labels.get(label) == "Evicted",
        timeout=60,
        what="the evicted copy's node label",
    )
    wait_for(
        lambda: cache_status(node_k8s, namespace, idle)["nodes"][0]["phase"] == "Evicted",
        timeout=60,
        what="the evicted cache's node state",
    )

    resource(node_k8s, API, "ModelCache").patch(  # pin the new one too: nothing may go any more
        name=new,
        namespace=namespace,
        body={"spec": {"storage": {"nodeLocal": {"pinned": True}}}},
        content_type="application/merge-patch+json",
    )
    used, free = used_and_free(small_node_path)
    full = cache("full")
    status = wait_phase(node_k8s, namespace, full, {"Ready", "Degraded", "Failed"})
    (state,) = status["nodes"]
    assert state["phase"] == "InsufficientStorage", status
    message = state["message"]
    print(f"InsufficientStorage: {message}")
    assert f"has {free} free" in message and f"({used} used)" in message
    assert f"{namespace}/{pinned} (pinned by its cache)" in message
    assert f"{namespace}/{new} (pinned by its cache)" in message
    assert condition(status, "Degraded")["reason"] == "InsufficientStorage"
    assert used_and_free(small_node_path) == (used, free), "nothing of the copy that cannot fit was written"
