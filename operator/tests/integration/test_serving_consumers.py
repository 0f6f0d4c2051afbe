"""`status.consumers` on the real control plane: labelled pods counted per ModelCache and KVCacheTier, and
counted down when they go; a cache that pods use cannot be deleted until they go."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ApiException
from strata_operator.api import API_VERSION
from strata_testsupport.kube import get_or_none, resource, wait_for
from strata_testsupport.webhook import RunningWebhook

from .test_modelcache_support import unique
from .test_serving_webhook import create_pod, kv_tier, pod_body, ready_shared_cache

pytestmark = pytest.mark.integration


def consumers(k8s: DynamicClient, kind: str, namespace: str, name: str) -> int | None:
    status = resource(k8s, API_VERSION, kind).get(name=name, namespace=namespace).to_dict().get("status") or {}
    return status.get("consumers")


def test_pods_using_a_cache_or_tier_are_counted_in_its_status(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    cache, tier = ready_shared_cache(k8s, namespace), kv_tier(k8s, namespace)
    wait_for(lambda: consumers(k8s, "ModelCache", namespace, cache) == 0, what="a count of 0 before any pod")
    both = {"strata.dev/model-cache": cache, "strata.dev/kv-cache-tier": tier}
    for index in range(3):
        create_pod(k8s, namespace, pod_body(unique(f"vllm-{index}"), both))
    create_pod(k8s, namespace, pod_body("model-only", {"strata.dev/model-cache": cache}))
    wait_for(lambda: consumers(k8s, "ModelCache", namespace, cache) == 4, what="four consumers of the cache")
    wait_for(lambda: consumers(k8s, "KVCacheTier", namespace, tier) == 3, what="three consumers of the tier")

    resource(k8s, "v1", "Pod").delete(name="model-only", namespace=namespace, grace_period_seconds=0)
    wait_for(lambda: consumers(k8s, "ModelCache", namespace, cache) == 3, what="the deleted pod counted out")
    assert consumers(k8s, "KVCacheTier", namespace, tier) == 3


def test_a_cache_in_use_cannot_be_deleted_until_its_pods_go(
    k8s: DynamicClient, operator: Any, namespace: str, pod_webhook: RunningWebhook
) -> None:
    cache = ready_shared_cache(k8s, namespace)
    create_pod(k8s, namespace, pod_body("vllm", {"strata.dev/model-cache": cache}))
    caches = resource(k8s, API_VERSION, "ModelCache")
    with pytest.raises(ApiException) as refused:
        caches.delete(name=cache, namespace=namespace)
    message = json.loads(refused.value.body)["message"]
    assert f"ModelCache {cache} is used by 1 pod(s) (vllm)" in message

    resource(k8s, "v1", "Pod").delete(name="vllm", namespace=namespace, grace_period_seconds=0)
    wait_for(lambda: get_or_none(k8s, "v1", "Pod", "vllm", namespace) is None, what="the pod gone")
    caches.delete(name=cache, namespace=namespace)
