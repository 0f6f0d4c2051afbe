"""KVCacheTier controller cost with many GPU nodes, on the real local control plane (kwok runs the pods).

Measures, in one run:
- reconcile latency: a full reconcile (validate against every node, apply 4-5 children, read the
  DaemonSet and pods, compute status) and a status-only refresh (what a DaemonSet status event costs);
- status aggregation: `compute_status` alone over N pods, and the pod/node listing it needs, with
  plain JSON decoding side by side with the dynamic client's object wrapping (the peer), as a ratio;
- operator reaction: a spec change until the DaemonSet carries the new config hash, and until status
  reports it, with the operator running in-process (kopf).

Usage: python bench/operator_kvcachetier.py [--nodes 500] [--runs 10]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testsupport"))

from strata_operator import kube  # noqa: E402
from strata_operator.api.kinds import all_crds  # noqa: E402
from strata_operator.api.kvcachetier import KVCacheTierSpec  # noqa: E402
from strata_operator.handlers.kvcachetier import io  # noqa: E402
from strata_operator.handlers.kvcachetier import reconcile as reconciler  # noqa: E402
from strata_operator.resources.core import label_selector  # noqa: E402
from strata_operator.resources.kvcachetier.names import CONFIG_HASH_ANNOTATION, TierRef  # noqa: E402
from strata_operator.resources.kvcachetier.observed import Observed  # noqa: E402
from strata_operator.resources.kvcachetier.status import Checked, compute_status  # noqa: E402
from strata_operator.resources.kvcachetier.validation import ClusterFacts, validate  # noqa: E402
from strata_testsupport.cluster import install_crds  # noqa: E402
from strata_testsupport.kube import fake_node, new_dynamic_client, resource, wait_for  # noqa: E402
from strata_testsupport.localcluster import LocalCluster  # noqa: E402

NAMESPACE = "bench"
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
TIER = {
    "apiVersion": "strata.dev/v1alpha1",
    "kind": "KVCacheTier",
    "metadata": {"name": "kv", "namespace": NAMESPACE},
    "spec": {
        "nodeSelector": {"gpu": "true"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        "l1": {"size": "16Gi"},
        "updateStrategy": {"maxUnavailable": "25%"},
    },
}


def timed(fn: Callable[[], Any], runs: int) -> tuple[float, float]:
    """Median and minimum wall time of `fn` in milliseconds."""
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    return statistics.median(samples), min(samples)


def row(label: str, median_min: tuple[float, float]) -> None:
    print(f"  {label:<58} median {median_min[0]:9.1f} ms   min {median_min[1]:9.1f} ms", flush=True)


def create_nodes(client: Any, count: int) -> float:
    nodes = resource(client, "v1", "Node")
    start = time.monotonic()
    for index in range(count):
        nodes.create(body=fake_node(f"gpu-{index:04d}", labels={"gpu": "true"}, taints=[TAINT]))
    return time.monotonic() - start


def wait_all_ready(client: Any, count: int, timeout: float) -> float:
    start = time.monotonic()

    def ready() -> bool:
        ds = kube.read("apps/v1", "DaemonSet", "kv", NAMESPACE) or {}
        status = ds.get("status") or {}
        settled = status.get("observedGeneration") == ds.get("metadata", {}).get("generation")
        counts = (status.get(k) for k in ("desiredNumberScheduled", "updatedNumberScheduled", "numberReady"))
        return settled and all(n == count for n in counts)

    wait_for(ready, timeout=timeout, interval=2, what=f"{count} kvserver pods ready")
    return time.monotonic() - start


def measure_reconcile(runs: int) -> None:
    body = {"metadata": {"name": "kv", "namespace": NAMESPACE}}
    reconciler.reconcile(body)
    print("reconcile (direct calls, steady state):")
    row("full: validate, apply children, observe, status", timed(lambda: reconciler.reconcile(body), runs))
    row("status only (a DaemonSet status event)", timed(lambda: reconciler.reconcile(body, full=False), runs))


def measure_aggregation(runs: int) -> None:
    tier_body = io.read_tier("kv", NAMESPACE) or {}
    spec = KVCacheTierSpec.model_validate(tier_body["spec"])
    tier = TierRef.from_body(tier_body)
    selector = label_selector(tier.selector_labels())
    pods = kube.list_objects("v1", "Pod", namespace=NAMESPACE, label_selector=selector)
    nodes = kube.list_objects("v1", "Node", label_selector="gpu=true")
    daemonset = kube.read("apps/v1", "DaemonSet", "kv", NAMESPACE)
    print(f"status aggregation ({len(pods)} pods, {len(nodes)} nodes):")
    observed = Observed(tier, daemonset=daemonset, pods=pods)
    row("compute_status (pure)", timed(lambda: compute_status(spec, observed, Checked()), runs))
    row("validate against every node (pure)", timed(lambda: validate(spec, ClusterFacts(nodes=nodes)), runs))
    raw_pods = timed(lambda: kube.list_objects("v1", "Pod", namespace=NAMESPACE, label_selector=selector), runs)
    pod_api = resource(kube.dynamic_client(), "v1", "Pod")
    wrapped_pods = timed(lambda: pod_api.get(namespace=NAMESPACE, label_selector=selector).to_dict(), runs)
    raw_nodes = timed(lambda: kube.list_objects("v1", "Node", label_selector="gpu=true"), runs)
    node_api = resource(kube.dynamic_client(), "v1", "Node")
    wrapped_nodes = timed(lambda: node_api.get(label_selector="gpu=true").to_dict(), runs)
    row("list pods, plain JSON (used)", raw_pods)
    row("list pods, dynamic client objects (peer)", wrapped_pods)
    row("list nodes, plain JSON (used)", raw_nodes)
    row("list nodes, dynamic client objects (peer)", wrapped_nodes)
    print(f"  ratio peer/used: pods {wrapped_pods[0] / raw_pods[0]:.1f}x, nodes {wrapped_nodes[0] / raw_nodes[0]:.1f}x")


def measure_reaction(client: Any, count: int, timeout: float) -> None:
    from kopf.testing import KopfRunner
    from strata_operator.cli import HANDLERS_MODULE

    args = ["run", "-m", HANDLERS_MODULE, "--standalone", f"--namespace={NAMESPACE}"]
    with KopfRunner(args, timeout=60):
        time.sleep(5)  # resume handlers settle
        before = (kube.read("apps/v1", "DaemonSet", "kv", NAMESPACE) or {})["spec"]["template"]["metadata"]
        tiers = resource(client, "strata.dev/v1alpha1", "KVCacheTier")
        start = time.monotonic()
        tiers.patch(
            body={"spec": {"l1": {"size": "12Gi"}}},
            name="kv",
            namespace=NAMESPACE,
            content_type="application/merge-patch+json",
        )

        def template_hash() -> str:
            ds = kube.read("apps/v1", "DaemonSet", "kv", NAMESPACE) or {}
            return str(ds["spec"]["template"]["metadata"]["annotations"][CONFIG_HASH_ANNOTATION])

        old = before["annotations"][CONFIG_HASH_ANNOTATION]
        wait_for(lambda: template_hash() != old, timeout=60, interval=0.05)
        applied = time.monotonic() - start
        new = template_hash()
        wait_for(
            lambda: (io.read_tier("kv", NAMESPACE) or {})["status"].get("configHash") == new, timeout=60, interval=0.05
        )
        reported = time.monotonic() - start
        rolled = wait_all_ready(client, count, timeout)
    # KopfRunner captures stdout while it runs: report afterwards.
    print("operator reaction (kopf in-process):")
    print(f"  spec change -> DaemonSet template updated   {applied * 1000:9.0f} ms")
    print(f"  spec change -> status.configHash updated     {reported * 1000:9.0f} ms")
    print(f"  rollout of {count} pods (DaemonSet controller, scheduler, kwok) {rolled:7.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--skip-reaction", action="store_true", help="skip the kopf reaction/rollout phase")
    args = parser.parse_args()
    with LocalCluster() as cluster:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        kube.reset_clients()
        client = new_dynamic_client(str(cluster.kubeconfig))
        install_crds(client, all_crds())
        resource(client, "v1", "Namespace").create(
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        print(f"{args.nodes} fake GPU nodes created in {create_nodes(client, args.nodes):.1f} s", flush=True)
        resource(client, "strata.dev/v1alpha1", "KVCacheTier").create(body=TIER, namespace=NAMESPACE)
        start = time.monotonic()
        reconciler.reconcile(TIER)
        print(f"first reconcile (creates the children) {1000 * (time.monotonic() - start):.0f} ms")
        print(f"all {args.nodes} servers ready after {wait_all_ready(client, args.nodes, args.timeout):.1f} s")
        measure_reconcile(args.runs)
        measure_aggregation(args.runs)
        if not args.skip_reaction:
            measure_reaction(client, args.nodes, args.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
