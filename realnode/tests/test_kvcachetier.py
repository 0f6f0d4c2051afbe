"""KVCacheTier on the real node, run by the operator the chart installed: the DaemonSet pod serves from the
rendered ConfigMap (read-only root filesystem, non-root, probes passing), a client pod that takes the
connection ConfigMap with envFrom reaches it through the Service's DNS name and round-trips chunks, a killed
server pod is replaced by one that still serves them from L2, and the status shows usage scraped from the pod.
Deleting a cache and a tier removes every child and label."""

from __future__ import annotations

import time
import urllib.request

import pytest
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import NODE_NAME
from strata_testsupport.pods import (
    API,
    RUNTIME_UID,
    kv_client_pod,
    kv_tier_spec,
    kv_token_secret,
    rwx_claim,
    unique,
    upload_model,
)
from strata_testsupport.realnode import RELEASE_NAMESPACE
from strata_testsupport.scenarios import (
    deleting_leaves_nothing_behind,
    preload_from_s3,
    ready_server,
    tier_serves_a_pod_on_its_node,
)

pytestmark = [pytest.mark.integration, pytest.mark.realnode]


def test_tier_serves_chunks_by_service_name_and_keeps_them_across_a_killed_pod(node_site):
    site, tier = node_site, unique("kv")
    kv_token_secret(site.client, site.namespace)
    claim = f"{tier}-l2"
    rwx_claim(site.client, site.namespace, claim)
    started = time.monotonic()
    first = tier_serves_a_pod_on_its_node(site, tier, kv_tier_spec(claim))
    print(f"KVCacheTier apply -> chunks round-tripped: {time.monotonic() - started:.1f}s")
    container = first["spec"]["containers"][0]
    security = {**first["spec"].get("securityContext", {}), **container["securityContext"]}
    assert security["readOnlyRootFilesystem"] is True and security["runAsNonRoot"] is True
    assert security["runAsUser"] == RUNTIME_UID and first["spec"]["nodeName"] == NODE_NAME
    assert container["readinessProbe"] and container["livenessProbe"]

    def usage_scraped() -> dict | None:
        status = resource(site.client, API, "KVCacheTier").get(name=tier, namespace=site.namespace).to_dict()["status"]
        usage = status.get("usage") or {}
        return status if usage.get("tiers") and any(t.get("usedBytes") for t in usage["tiers"]) else None

    status = wait_for(usage_scraped, timeout=120, interval=2, what="usage scraped from the server pod")
    assert status["readyInstances"] == 1, status
    # The same scrape judges offloading: a window just started (or a few lookups) is InsufficientData.
    effective = next(c for c in status["conditions"] if c["type"] == "OffloadEffective")
    assert (effective["status"], effective["reason"]) == ("Unknown", "InsufficientData"), effective
    assert status["offload"]["recomputeSource"] == "Setting" and "window" in status["offload"], status["offload"]
    # ...and the operator pod serves it as gauges on its metrics port (chart metrics.enabled, 8081).
    labels = f'namespace="{site.namespace}",kvcachetier="{tier}",verdict="InsufficientData"'
    gauge = f"strata_kvcachetier_offload_verdict{{{labels}}} 1"

    def operator_gauges() -> str | None:
        for pod in resource(site.client, "v1", "Pod").get(namespace=RELEASE_NAMESPACE).to_dict()["items"]:
            ip = pod.get("status", {}).get("podIP")
            if pod["spec"]["containers"][0]["name"] == "operator" and ip:
                text = urllib.request.urlopen(f"http://{ip}:8081/metrics", timeout=10).read().decode()
                return text if gauge in text else None
        return None

    wait_for(operator_gauges, timeout=60, interval=2, what="the tier's verdict on the operator's /metrics")

    resource(site.client, "v1", "Pod").delete(
        name=first["metadata"]["name"], namespace=site.namespace, body={"gracePeriodSeconds": 0}
    )
    second = ready_server(site, tier, not_uid=first["metadata"]["uid"])
    assert second["metadata"]["uid"] != first["metadata"]["uid"]
    again = kv_client_pod(site.client, site.namespace, tier, "reader-after-restart", "read", 40)
    assert all(again[f"chunk-{i:04d}"] for i in range(40)), "the new pod serves the chunks from L2"


def test_deleting_a_cache_and_a_tier_leaves_nothing_behind(node_site, node_s3):
    site, name, tier = node_site, unique("gone"), unique("kvgone")
    bucket = node_s3.create_bucket()
    upload_model(node_s3, bucket, "tiny", files=1)
    preload_from_s3(site, name, f"s3://{bucket}/tiny")
    kv_token_secret(site.client, site.namespace)
    rwx_claim(site.client, site.namespace, f"{tier}-l2")
    tier_serves_a_pod_on_its_node(site, tier, kv_tier_spec(f"{tier}-l2"), count=4)
    deleting_leaves_nothing_behind(site, [name], [tier])
