"""ImageVolume: nothing to download, the volume is a Kubernetes image volume; optional per-node pre-pull."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient

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
IMAGE = "oci://registry.example/models/qwen2.5-7b:1.0"


@pytest.fixture
def nodes(k8s: DynamicClient) -> Iterator[Heartbeat]:
    heartbeat = Heartbeat(k8s)
    yield heartbeat
    heartbeat.stop()


def test_image_volume_is_ready_without_a_download(k8s: DynamicClient, operator: Any, namespace: str) -> None:
    name = unique("mc")
    create_cache(k8s, namespace, name, {"source": {"uri": IMAGE}, "storage": {"mode": "ImageVolume"}})
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "phase Ready")
    assert status["volume"]["volume"]["image"] == {
        "reference": "registry.example/models/qwen2.5-7b:1.0",
        "pullPolicy": "IfNotPresent",
    }
    assert status["volume"]["volumeMount"]["readOnly"] is True
    assert cache_jobs(k8s, namespace, name, "prepull") == [] and cache_jobs(k8s, namespace, name) == []


def test_image_pre_pull_runs_on_each_selected_node(
    k8s: DynamicClient, operator: Any, namespace: str, nodes: Heartbeat
) -> None:
    pool = {"strata-test/pool": unique("pool")}
    node = nodes.add(unique("gpu"), pool)
    name = unique("mc")
    storage = {"mode": "ImageVolume", "imageVolume": {"prePull": True, "nodeSelector": pool}}
    create_cache(k8s, namespace, name, {"source": {"uri": IMAGE}, "storage": storage})
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 1, "one pre-pull")
    assert status["phase"] == "Ready" and status["nodes"][0]["name"] == node
    assert condition(get_cache(k8s, namespace, name), "Reconciling")["status"] == "True"
    job = cache_jobs(k8s, namespace, name, "prepull")[0]
    volumes = job["spec"]["template"]["spec"]["volumes"]
    assert {"name": "model", "image": status["volume"]["volume"]["image"]} in volumes
    finish_job(k8s, namespace, job["metadata"]["name"], None)
    wait_for_status(k8s, namespace, name, lambda s: s.get("readyNodes") == 1, "the image pulled")
    assert condition(get_cache(k8s, namespace, name), "Reconciling")["status"] == "False"
