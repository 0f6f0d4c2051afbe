"""Admission latency the pod webhook adds, on the real local control plane, in one run.

Pod creations alternate between a pod labelled `strata.dev/model-cache` and `strata.dev/kv-cache-tier` (the API
server calls Strata's webhook over TLS on loopback: two webhooks, each reading the cache and the tier, the first
returning the patch) and the same pod without the labels (never sent, by objectSelector). Each create call is
timed from the client; p50/p99 of both and the difference are reported. No operator runs: the ModelCache's status
is written once through the status subresource (Ready), so the webhook wires without a gate.

Usage: python bench/webhook_admission.py [--pods 1000] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for part in ("operator", "loader", "kvserver", "testsupport"):
    sys.path.insert(0, str(REPO / part))

NAMESPACE = "bench"


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def pod(name: str, labels: dict[str, str]) -> dict[str, Any]:
    container = {"name": "vllm", "image": "vllm/vllm-openai:latest"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"containers": [container]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000, help="creations of each kind")
    parser.add_argument("--batch", type=int, default=100, help="pods deleted after every this many of each kind")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    from strata_operator import kube
    from strata_operator.api import API_VERSION
    from strata_operator.api.kinds import all_crds
    from strata_testsupport.cluster import install_crds
    from strata_testsupport.kube import new_dynamic_client, resource
    from strata_testsupport.localcluster import LocalCluster
    from strata_testsupport.webhook import RunningWebhook, webhook_configuration, write_webhook_tls

    with (
        LocalCluster(controller_manager=False, scheduler=False, kwok=False) as cluster,
        tempfile.TemporaryDirectory() as tmp,
    ):
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        kube.reset_clients()
        k8s = new_dynamic_client(str(cluster.kubeconfig))
        install_crds(k8s, all_crds())
        resource(k8s, "v1", "Namespace").create(
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        resource(k8s, "v1", "ServiceAccount").create(
            body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}}, namespace=NAMESPACE
        )
        caches = resource(k8s, API_VERSION, "ModelCache")
        spec = {"source": {"uri": "s3://models/llama"}, "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}}}
        caches.create(
            body={"apiVersion": API_VERSION, "kind": "ModelCache", "metadata": {"name": "llama"}, "spec": spec},
            namespace=NAMESPACE,
        )
        ready = {
            "type": "Ready",
            "status": "True",
            "reason": "Preloaded",
            "message": "bench",
            "lastTransitionTime": "2026-01-01T00:00:00Z",
        }
        caches.status.patch(
            name="llama",
            namespace=NAMESPACE,
            body={"status": {"conditions": [ready]}},
            content_type="application/merge-patch+json",
        )
        tiers = resource(k8s, API_VERSION, "KVCacheTier")
        tiers.create(
            body={"apiVersion": API_VERSION, "kind": "KVCacheTier", "metadata": {"name": "kv"}, "spec": {}},
            namespace=NAMESPACE,
        )

        cert_dir = Path(tmp) / "tls"
        ca = write_webhook_tls(cert_dir)
        webhook = RunningWebhook(cert_dir)
        webhook.start()
        configurations = resource(k8s, "admissionregistration.k8s.io/v1", "MutatingWebhookConfiguration")
        configurations.create(body=webhook_configuration("strata-bench", webhook.url, ca))
        time.sleep(2)  # the API server picks up webhook configurations from a watch

        pods = resource(k8s, "v1", "Pod")
        labels = {"bench": "1", "strata.dev/model-cache": "llama", "strata.dev/kv-cache-tier": "kv"}
        plain = {"bench": "1", "app": "plain"}
        timings: dict[str, list[float]] = {"webhook": [], "none": []}
        for i in range(args.pods):
            order = [("webhook", labels), ("none", plain)]
            for kind, pod_labels in order if i % 2 else reversed(order):  # alternate who goes first
                started = time.perf_counter()
                created = pods.create(body=pod(f"{kind}-{i}", pod_labels), namespace=NAMESPACE).to_dict()
                timings[kind].append(time.perf_counter() - started)
                if kind == "webhook":
                    assert any(v["name"] == "model-llama" for v in created["spec"]["volumes"]), "the pod was not wired"
            if (i + 1) % args.batch == 0:
                pods.delete(namespace=NAMESPACE, label_selector="bench=1", grace_period_seconds=0)
        webhook_requests = webhook.requests
        webhook.close()

    result: dict[str, Any] = {"pods_each": args.pods, "webhook_requests": webhook_requests}
    for kind, values in timings.items():
        ms = [v * 1000 for v in values]
        result[kind] = {
            "p50_ms": round(percentile(ms, 0.5), 2),
            "p99_ms": round(percentile(ms, 0.99), 2),
            "mean_ms": round(statistics.fmean(ms), 2),
        }
    result["added_p50_ms"] = round(result["webhook"]["p50_ms"] - result["none"]["p50_ms"], 2)
    result["added_p99_ms"] = round(result["webhook"]["p99_ms"] - result["none"]["p99_ms"], 2)
    result["p50_ratio"] = round(result["webhook"]["p50_ms"] / result["none"]["p50_ms"], 2)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
