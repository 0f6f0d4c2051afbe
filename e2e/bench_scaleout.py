"""The scale-out measurement on kind (issue 40 item 4), run by bench/kind_scaleout.py, which prints and plots it;
not a test (pytest collects it only when named), but it uses the suite's cluster, chart and S3 server.

A vLLM Deployment (the stock CPU image) scales 1 -> 2 -> 4 replicas across the two workers (a topology spread keeps
them even), per side:
- `strata`: the Deployment names a NodeLocal ModelCache and a KVCacheTier by label; the model was put on both workers
  once (one read of the origin, the second copy from the first worker's peer) before any replica starts, and the
  tier's shared L2 holds the shared prompt's KV once any engine computed it;
- `s3-pull`: what users do without Strata: each pod's init container downloads the model from the same S3 server
  into its emptyDir (boto3's transfer manager), then vLLM loads it from there; no tier.
Each step times, for every new replica, the scale command -> the first token of a 1024-token prompt every replica
is sent (a shared system prompt), polled through the API server's pod proxy from the moment the pod has an address;
and the bytes the origin sent during the step, counted by the kernel (an iptables rule on the S3 server's port),
not by any client. Rounds alternate the order of the sides. The KV tier's L2 is another S3 server, so its traffic
is not counted as the origin's.

Parameters from the environment: SCALEOUT_ROUNDS (3), SCALEOUT_SHAPE (`1g` or `test`, bench/serving_start.py's
shapes), SCALEOUT_OUTPUT (the JSON file to write; required)."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from strata_testsupport.kindengines import (
    LONG_PROMPT,
    complete,
    engine_workers,
    node_local_cache,
    s3_tier,
    wait_cache_ready,
    wait_servers_ready,
)
from urllib3.exceptions import HTTPError

pytestmark = [pytest.mark.integration, pytest.mark.kind, pytest.mark.timeout(6 * 3600)]

SIDES = ("strata", "s3-pull")
STEPS = (1, 2, 4)
ENGINES_LABEL = "strata.dev/e2e-scaleout"
EGRESS_CHAIN = "STRATA-ORIGIN-EGRESS"


class OriginEgress:
    """Bytes a server on this host sent from its TCP port, counted by the kernel: an iptables rule in OUTPUT that
    jumps to an empty chain of its own (so it decides nothing) and whose counters are read back."""

    def __init__(self, address: str, port: int) -> None:
        self.match = ["-p", "tcp", "-s", address, "--sport", str(port), "-j", EGRESS_CHAIN]

    def __enter__(self) -> OriginEgress:
        subprocess.run(["iptables", "-w", "-N", EGRESS_CHAIN], capture_output=True)  # kept from an earlier run: fine
        subprocess.run(["iptables", "-w", "-I", "OUTPUT", *self.match], check=True)
        return self

    def __exit__(self, *_: object) -> None:
        subprocess.run(["iptables", "-w", "-D", "OUTPUT", *self.match], check=False)
        subprocess.run(["iptables", "-w", "-X", EGRESS_CHAIN], check=False)

    def sent(self) -> int:
        listed = subprocess.run(
            ["iptables", "-w", "-L", "OUTPUT", "-v", "-x", "-n"], capture_output=True, text=True, check=True
        ).stdout
        return sum(int(line.split()[1]) for line in listed.splitlines() if EGRESS_CHAIN in line.split()[2:3])


def first_tokens(
    k8s: Any, namespace: str, name: str, wanted: int, known: set[str], started: float
) -> list[dict[str, Any]]:
    """Wait until `wanted` replicas other than `known` (pod uids) have each answered LONG_PROMPT; one poller thread per
    new pod, from the moment it has an address. Each sample: the pod, its node, the seconds from `started` (the
    scale command) to its answer, and the tokens it took from a cache."""
    from strata_testsupport.kube import resource, wait_for

    pods = resource(k8s, "v1", "Pod")
    answers: dict[str, dict[str, Any]] = {}
    polling: set[str] = set()
    lock = threading.Lock()

    def poll(pod: dict[str, Any]) -> None:
        deadline = time.monotonic() + 1800
        while time.monotonic() < deadline:
            try:
                answer = complete(k8s, pod, LONG_PROMPT, max_tokens=1, timeout=120)
            except (ApiException, HTTPError, OSError):
                time.sleep(0.5)
                continue
            details = answer["usage"].get("prompt_tokens_details") or {}
            with lock:
                answers[pod["metadata"]["uid"]] = {
                    "pod": pod["metadata"]["name"],
                    "node": pod["spec"]["nodeName"],
                    "scale_to_first_token_s": time.monotonic() - started,
                    "cached_tokens": details.get("cached_tokens") or 0,
                }
            return

    def done() -> bool:
        for pod in pods.get(namespace=namespace, label_selector=f"app={name}").to_dict()["items"]:
            uid = pod["metadata"]["uid"]
            if uid in known or uid in polling or not pod.get("status", {}).get("podIP"):
                continue
            polling.add(uid)
            threading.Thread(target=poll, args=(pod,), daemon=True).start()
        with lock:
            return len(answers) >= wanted

    wait_for(done, timeout=1800, interval=0.5, what=f"{wanted} new replicas of {name} answering")
    return list(answers.values())


def scale_out(site: Any, egress: OriginEgress, side: str, body: dict[str, Any]) -> list[dict[str, Any]]:
    """Create the Deployment at one replica, scale it to each of STEPS, then delete it; a sample per new replica
    and per step (its origin bytes and the time to its last new replica's first token)."""
    from strata_testsupport.kube import resource
    from strata_testsupport.serving import delete_deployment

    name, deployments = body["metadata"]["name"], resource(site.client, "apps/v1", "Deployment")
    known: set[str] = set()
    samples: list[dict[str, Any]] = []
    try:
        for step in STEPS:
            sent, started = egress.sent(), time.monotonic()
            if step == STEPS[0]:
                body["spec"]["replicas"] = step
                deployments.create(namespace=site.namespace, body=body)
            else:
                deployments.patch(name=name, namespace=site.namespace, body={"spec": {"replicas": step}})
            replicas = first_tokens(site.client, site.namespace, name, step - len(known), known, started)
            origin = egress.sent() - sent
            pods = resource(site.client, "v1", "Pod").get(namespace=site.namespace, label_selector=f"app={name}")
            known |= {p.metadata.uid for p in pods.items}
            for replica in replicas:
                samples.append({"side": side, "step": step, "kind": "replica", **replica})
            slowest = max(r["scale_to_first_token_s"] for r in replicas)
            samples.append({"side": side, "step": step, "kind": "step", "origin_bytes": origin, "seconds": slowest})
            times = ", ".join(f"{r['node']} {r['scale_to_first_token_s']:.1f}s" for r in replicas)
            print(f"{side} -> {step}: {times}; origin sent {origin / 1e6:.0f} MB", flush=True)
    finally:
        delete_deployment(site, name)
    return samples


def spread(body: dict[str, Any], image: str) -> dict[str, Any]:
    """Replicas on the labelled workers only, kept even across them (1, 1+1, 2+2)."""
    name = body["metadata"]["name"]
    pod = body["spec"]["template"]["spec"]
    pod["nodeSelector"] = {ENGINES_LABEL: "true"}
    pod["topologySpreadConstraints"] = [
        {
            "maxSkew": 1,
            "topologyKey": "kubernetes.io/hostname",
            "whenUnsatisfiable": "DoNotSchedule",
            "labelSelector": {"matchLabels": {"app": name}},
        }
    ]
    for container in pod.get("initContainers", []):
        container["image"] = image  # the download runs in the suite's runtime image (its boto3)
    return body


def test_scale_out(k8s_e2e, strata_release, kind_s3, kind_workers, hostpath_namespace, stock_vllm, tmp_path, e2e):
    from strata_testsupport.kube import delete_quietly, resource, wait_for
    from strata_testsupport.pods import API, s3_secret, unique
    from strata_testsupport.s3 import running_s3_server
    from strata_testsupport.scenarios import Site
    from strata_testsupport.serving import MODEL_SHAPES, deployment, make_model, s3_pull_deployment, upload_model_dir

    rounds, shape = int(os.environ.get("SCALEOUT_ROUNDS", "3")), os.environ.get("SCALEOUT_SHAPE", "1g")
    output = Path(os.environ["SCALEOUT_OUTPUT"])
    namespace, cache, tier = hostpath_namespace, "llama", "scaleout-kv"
    caches = resource(k8s_e2e, API, "ModelCache")
    origin = urllib.parse.urlparse(kind_s3.endpoint_url)
    site = Site(k8s_e2e, namespace, kind_s3.endpoint_url, "s3", shared_pvc=lambda _: {}, region=kind_s3.region)
    model = make_model(tmp_path / "llama", MODEL_SHAPES[shape])
    model_bytes = sum(p.stat().st_size for p in model.iterdir())
    result: dict[str, Any] = {"shape": shape, "model_bytes": model_bytes, "rounds": rounds, "samples": []}
    address = str(origin.hostname)
    with (
        running_s3_server(host=address) as kv_s3,
        OriginEgress(address, int(origin.port or 80)) as egress,
        engine_workers(k8s_e2e, kind_workers, ENGINES_LABEL),
    ):
        try:
            uri = upload_model_dir(kind_s3, model)
            s3_secret(k8s_e2e, namespace, "s3", kind_s3.access_key, kind_s3.secret_key)
            for worker in sorted(kind_workers):
                stock_vllm.load(worker)  # both workers serve replicas: one copy each, for the whole run

            # -- Strata's side, made once: the model on both workers (timed, its origin bytes counted), the tier ---
            sent, started = egress.sent(), time.monotonic()
            node_local_cache(k8s_e2e, kind_s3, namespace, cache, uri, ENGINES_LABEL)
            wait_cache_ready(k8s_e2e, namespace, cache, len(kind_workers), timeout=1800)
            result["preload"] = {"seconds": time.monotonic() - started, "origin_bytes": egress.sent() - sent}
            print(f"preload (once): {result['preload']}", flush=True)
            s3_tier(k8s_e2e, kv_s3, namespace, tier, engines=True)
            wait_servers_ready(k8s_e2e, namespace, tier, kind_workers)

            for round_no in range(rounds):
                for side in SIDES[round_no % 2 :] + SIDES[: round_no % 2]:
                    name = unique(side.split("-")[0])
                    if side == "strata":
                        body = deployment(name, stock_vllm.ref, cache, tier)
                    else:
                        body = s3_pull_deployment(name, stock_vllm.ref, uri, kind_s3.endpoint_url, "s3", kind_s3.region)
                    samples = scale_out(site, egress, side, spread(body, e2e.runtime_image))
                    result["samples"] += [s | {"round": round_no} for s in samples]
                    output.write_text(json.dumps(result, indent=2))  # what is measured so far survives a failure
        finally:
            delete_quietly(k8s_e2e, API, "ModelCache", cache, namespace)
            wait_for(lambda: not caches.get(namespace=namespace).items, timeout=300, interval=2, what="cache gone")
            delete_quietly(k8s_e2e, API, "KVCacheTier", tier, namespace)
    assert result["samples"], "nothing was measured"
