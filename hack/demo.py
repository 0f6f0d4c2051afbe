"""`make demo`: Strata on a real node, end to end, with timings.

Steps: build (once) and load the images; start a control plane and one real node (containerd, kubelet,
kube-proxy, CoreDNS) on this machine; `helm install` the chart, so the operator runs as a pod; put a generated
safetensors model into an S3 server the pods reach; a ModelCache preloads it into a ReadWriteMany claim and a
consumer pod reads every tensor back bit for bit; a KVCacheTier runs its server on the node and a client pod
round-trips chunks through the Service's DNS name; a vLLM Deployment (CPU) labelled with a ModelCache and a
KVCacheTier serves completions with the weights Strata loaded, and a fresh engine answers the same long prompt with
KV from Strata's tier; then many users (the serving-scale bench's user model, bench/serving_workload.py) talk to
two replicas of it behind round-robin, more than the engines' KV memory holds, with and without the tier, over a
few rounds; then everything stops and is swept.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testsupport"))
sys.path.insert(0, str(REPO / "bench"))

from serving_client import measured_users, single  # noqa: E402
from serving_workload import (  # noqa: E402
    Workload,
    engine_summary,
    kv_cache_lines,
    metric_delta,
    metric_sums,
    over_rounds,
    request_summary,
    rotated,
    users,
)
from strata_testsupport.kube import new_dynamic_client, resource, wait_for  # noqa: E402
from strata_testsupport.localcluster.node import (  # noqa: E402
    NODE_IP,
    NODE_NAME,
    SERVING_IMAGE,
    WORK_DIR,
    RealNode,
    leftovers,
    node_images_archive,
    serving_image_archive,
)
from strata_testsupport.pods import (  # noqa: E402
    API,
    STATIC_CLASS,
    kv_client_pod,
    kv_tier_spec,
    kv_token_secret,
    model_cache,
    pod_log,
    read_model_in_pod,
    rwx_claim,
    s3_model_spec,
    s3_secret,
    static_volume,
    upload_model,
    wait_phase,
)
from strata_testsupport.realnode import helm_upgrade, install_strata, pod_security_namespace  # noqa: E402
from strata_testsupport.s3 import running_s3_server  # noqa: E402
from strata_testsupport.scenarios import Site, ready_server, shared_cache_from_s3  # noqa: E402
from strata_testsupport.serving import (  # noqa: E402
    BLOCK_TOKENS,
    LOADED,
    MAX_MODEL_LEN,
    SERVED_NAME,
    TEST_MODEL,
    cached_tokens,
    complete,
    delete_deployment,
    deployment,
    engine_url,
    fresh_engine,
    make_model,
    metric,
    metrics_page,
    ready_engine,
    ready_engines,
    stored_chunks_reach,
    tier_spec,
    upload_model_dir,
)

NAMESPACE_LEVEL = "restricted"
MODEL = "tiny-llm"
TIER = "kv"


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def step(what: str, started: float) -> None:
    print(f"  {what}: {time.monotonic() - started:.1f}s", flush=True)


def preload(client: Any, namespace: str, s3: Any) -> None:
    banner("ModelCache (SharedPVC) preloads a model from S3; a consumer pod reads it back")
    bucket = s3.create_bucket("models")
    started = time.monotonic()
    digests = upload_model(s3, bucket, MODEL, files=4, tensor_bytes=32 << 20)
    step(f"uploaded a generated model ({len(digests)} tensors, ~256 MiB) to {s3.endpoint_url}", started)
    s3_secret(client, namespace, "s3-credentials", s3.access_key, s3.secret_key)
    static_volume(client, namespace, f"{MODEL}-model")
    started = time.monotonic()
    model_cache(client, namespace, MODEL, s3_model_spec(s3, bucket, MODEL, "s3-credentials"))
    status = wait_phase(client, namespace, MODEL, {"Ready", "Degraded", "Failed"}, timeout=600)
    step(f"kubectl apply -> {status['phase']} ({status.get('size')}, {status.get('totalFiles')} files)", started)
    if status["phase"] != "Ready":
        raise SystemExit(f"the cache did not become Ready: {status.get('conditions')}")
    print("  status.volume:", json.dumps(status["volume"]))
    started = time.monotonic()
    same = read_model_in_pod(client, namespace, "consumer", status["volume"]) == digests
    step(f"consumer pod read {len(digests)} tensors, bit for bit {'equal' if same else 'DIFFERENT'}", started)
    if not same:
        raise SystemExit("the consumer read different bytes")


def kv_round_trip(client: Any, namespace: str) -> None:
    banner("KVCacheTier: a server on the node, chunks through the Service's DNS name")
    kv_token_secret(client, namespace)
    claim = f"{TIER}-l2"
    rwx_claim(client, namespace, claim)
    started = time.monotonic()
    resource(client, API, "KVCacheTier").create(
        namespace=namespace,
        body={"apiVersion": API, "kind": "KVCacheTier", "metadata": {"name": TIER}, "spec": kv_tier_spec(claim)},
    )

    def ready() -> bool:
        status = resource(client, API, "KVCacheTier").get(name=TIER, namespace=namespace).to_dict().get("status")
        return bool(status and status.get("readyInstances") == 1)

    wait_for(ready, timeout=300, interval=1, what="the KV server pod")
    step("kubectl apply -> server pod ready on the node", started)
    for mode in ("write", "read"):
        started = time.monotonic()
        out = kv_client_pod(client, namespace, TIER, f"kv-{mode}", mode, 40)
        hits = sum(1 for k, v in out.items() if k.startswith("chunk-") and v)
        what = "wrote 40 chunks of 256 KiB" if mode == "write" else f"read back {hits}/40 chunks intact"
        step(f"client pod {what} via {out['host']}", started)


SERVING_CHUNK_TOKENS = 64
LONG_PROMPT = [3 + (i * 7919) % 31000 for i in range(1024)]


def serving_tier(site: Site, name: str) -> None:
    """A KVCacheTier for the CPU engines (the node socket with shared memory), once its server pod is ready."""
    body = {
        "apiVersion": API,
        "kind": "KVCacheTier",
        "metadata": {"name": name},
        "spec": tier_spec(SERVING_CHUNK_TOKENS),
    }
    resource(site.client, API, "KVCacheTier").create(namespace=site.namespace, body=body)
    ready_server(site, name)


def serve_llm(node: RealNode, client: Any, namespace: str, s3: Any, work: Path) -> None:
    banner("An LLM served with Strata: vLLM (CPU) in a Deployment that only names a ModelCache and a KVCacheTier")
    started = time.monotonic()
    node.import_images(serving_image_archive())
    helm_upgrade(
        node,
        "kvSocketDriver.enabled=true",
        f"kvSocketDriver.kubeletDir={WORK_DIR / 'kubelet'}",
        f"kvSocketDriver.stateDir={WORK_DIR / 'kv-sockets'}",
    )
    step("serving image imported, the chart's KV socket driver on", started)

    def shared_pvc(cache: str) -> dict[str, Any]:
        static_volume(client, namespace, f"{cache}-model")
        return {"size": "1Gi", "storageClassName": STATIC_CLASS}

    site = Site(client, namespace, s3.endpoint_url, "s3-credentials", shared_pvc, region=s3.region)
    started = time.monotonic()
    model = make_model(work / "llama", TEST_MODEL)
    uri = upload_model_dir(s3, model)
    size = sum(p.stat().st_size for p in model.iterdir()) / 1e6
    step(f"generated a Llama with a tokenizer ({size:.0f} MB, random weights) and uploaded it to {uri}", started)
    tier = "llm-kv"
    serving_tier(site, tier)
    started = time.monotonic()
    shared_cache_from_s3(site, "llama", uri)
    resource(client, "apps/v1", "Deployment").create(
        namespace=namespace, body=deployment("llm", SERVING_IMAGE, "llama", tier)
    )
    print("  applied the ModelCache and the Deployment together: the pod waits at the scheduling gate")
    engine = ready_engine(site, "llm", set())
    env = {e["name"]: e.get("value") for e in engine["spec"]["containers"][0].get("env") or []}
    print(f"  the engine's --model names the cache's revision, and so its KV namespace: {env.get('STRATA_MODEL_DIR')}")
    first = complete(engine, LONG_PROMPT)
    step(f"apply -> first completion of a {len(LONG_PROMPT)}-token prompt (preload included)", started)
    print(f"  text: {first['choices'][0]['text']!r}")
    stored_chunks_reach(engine, len(LONG_PROMPT) // SERVING_CHUNK_TOKENS - 1)
    started = time.monotonic()
    engine = fresh_engine(site, "llm", engine, set())
    step("pod deleted; the Deployment's next engine is ready", started)
    started = time.monotonic()
    second = complete(engine, LONG_PROMPT)
    same = second["choices"][0]["text"] == first["choices"][0]["text"]
    step(
        f"the fresh engine answered: {cached_tokens(second)} of {len(LONG_PROMPT)} prompt tokens from Strata's tier "
        f"({metric(engine, LOADED):.0f} chunks loaded), text {'the same' if same else 'DIFFERENT'}",
        started,
    )
    delete_deployment(site, "llm")
    users_past_kv_memory(site, "llama")
    for kind, name in (("ModelCache", "llama"), ("KVCacheTier", tier)):
        resource(client, API, kind).delete(name=name, namespace=namespace)
    helm_upgrade(node, "kvSocketDriver.enabled=false")


USERS = Workload(
    users=8,
    doc_tokens=(768, 1024),
    question_tokens=32,
    answer_tokens=16,
    think_seconds=1.0,
    max_prompt_tokens=MAX_MODEL_LEN,
)
"""Issue 41's user model, sized for 2 cores: each user a document of its own and a stream of questions about it."""
KV_BLOCKS = 96
"""Each engine's KV memory: 3,072 tokens, about three users' documents of eight (vLLM needs MAX_MODEL_LEN's)."""
REPLICAS = 2
ROUNDS = 3
USER_SECONDS = 30.0
SIDES = ("with tier", "without")
SUMMARY = {
    "throughput_tok_s": ("total tok/s", "{:.0f}"),
    "ttft_p50_s": ("TTFT p50 s", "{:.2f}"),
    "hit_ratio": ("hit ratio", "{:.2f}"),
}


def users_side(site: Site, name: str, cache: str, wired: bool, workload: Workload) -> dict[str, Any]:
    """Fresh replicas of the engine, wired by label to a fresh tier of their own or to none, the users for
    USER_SECONDS, and what the point adds up to; the Deployment and the tier are gone on return."""
    started = time.monotonic()
    tier = f"{name}-kv" if wired else None
    if tier:
        serving_tier(site, tier)
    body = deployment(name, SERVING_IMAGE, cache, tier, replicas=REPLICAS, kv_blocks=KV_BLOCKS)
    resource(site.client, "apps/v1", "Deployment").create(namespace=site.namespace, body=body)
    try:
        pods = ready_engines(site, name, REPLICAS)
        urls = [engine_url(pod) for pod in pods]
        for url in urls:  # the engine's own first-request costs are not the point's
            asyncio.run(single(url, [7, 8, 9, 10] * 8, SERVED_NAME))
        ready_s = time.monotonic() - started
        primed, requests, before, after = measured_users(
            urls, workload, USER_SECONDS, 600, lambda: [metric_sums(metrics_page(p)) for p in pods], SERVED_NAME
        )
        kv_cache = kv_cache_lines(pod_log(site.client, site.namespace, pods[0]["metadata"]["name"]))
    finally:
        delete_deployment(site, name)
        if tier:
            resource(site.client, API, "KVCacheTier").delete(name=tier, namespace=site.namespace)
    point = request_summary(requests, USER_SECONDS) | engine_summary(metric_delta(before, after))
    return point | {"ready_s": ready_s, "primed_prompt_tokens": primed, "kv_cache": kv_cache}


def users_past_kv_memory(site: Site, cache: str) -> None:
    banner(
        f"Many users past the engines' KV memory: {REPLICAS} replicas behind round-robin (no prefix-aware router), "
        "with and without the tier"
    )
    documents = sum(len(u.document) for u in users(USERS))
    print(
        f"  {USERS.users} users, each a document of {USERS.doc_tokens[0]}-{USERS.doc_tokens[1]} tokens ({documents} in "
        f"all) and {USERS.question_tokens}-token questions, {USERS.answer_tokens}-token answers, think ~"
        f"{USERS.think_seconds:.0f}s; each engine's KV memory {KV_BLOCKS * BLOCK_TOKENS} tokens "
        f"(--num-gpu-blocks-override {KV_BLOCKS}); {ROUNDS} rounds of {USER_SECONDS:.0f}s a side, sides alternated, "
        "fresh Deployments, documents and tier each round"
    )
    started = time.monotonic()
    points: list[dict[str, Any]] = []
    for n in range(ROUNDS):
        workload = dataclasses.replace(USERS, seed=n)
        for side in rotated(SIDES, n):
            name = f"users-{n + 1}-{'tier' if side == 'with tier' else 'none'}"
            point = users_side(site, name, cache, side == "with tier", workload)
            points.append(point | {"side": side})
            if len(points) == 1:
                print(f"  vLLM: {'; '.join(point['kv_cache']) or 'no KV cache size in its log'}")
            print(
                f"  round {n + 1} {side}: {REPLICAS} engines ready in {point['ready_s']:.0f}s, "
                f"{point['primed_prompt_tokens']} prompt tokens primed; {point['requests']} requests, "
                + ", ".join(f"{label} {form.format(point[k])}" for k, (label, form) in SUMMARY.items()),
                flush=True,
            )
    comparison(points)
    step(f"{ROUNDS} rounds of both sides", started)


def comparison(points: list[dict[str, Any]]) -> None:
    """Each side's median [min-max] over the rounds, and the medians' ratio."""
    summary = over_rounds(points, list(SUMMARY))
    print(f"  over {ROUNDS} rounds, median [min-max]:")
    for side, numbers in summary.items():
        cells = [
            f"{label} {form.format(m)} [{form.format(lo)}-{form.format(hi)}]"
            for k, (label, form) in SUMMARY.items()
            for m, lo, hi in [numbers[k]]
        ]
        print(f"  {side:>10}: " + ", ".join(cells))
    with_tier, without = summary["with tier"], summary["without"]
    ratios = [f"{label} {with_tier[k][0] / without[k][0]:.2f}x" for k, (label, _) in SUMMARY.items() if without[k][0]]
    print("  with/without (medians): " + ", ".join(ratios))


def main() -> int:
    banner("Images (built once from a local Debian base, no registry)")
    started = time.monotonic()
    images = node_images_archive()
    step(f"{images.name}", started)
    banner(f"A control plane and one real node ({NODE_NAME} at {NODE_IP}, reachable only from this machine)")
    started = time.monotonic()
    with RealNode(images) as node:
        step(f"node Ready ({', '.join(f'{k} {v}s' for k, v in node.timings.items())})", started)
        client = new_dynamic_client(str(node.kubeconfig))
        banner("helm install charts/strata: the operator runs as a pod from its image")
        print(f"  operator pod ready after {install_strata(node, client)}s")
        with running_s3_server(host=NODE_IP) as s3:
            for namespace in pod_security_namespace(client, NAMESPACE_LEVEL):
                print(f"  namespace {namespace} enforces Pod Security '{NAMESPACE_LEVEL}'")
                preload(client, namespace, s3)
                kv_round_trip(client, namespace)
                with tempfile.TemporaryDirectory(prefix="strata-demo-") as work:
                    serve_llm(node, client, namespace, s3, Path(work))
        banner("Stopping")
    left = leftovers()
    print(
        f"  left behind: {left}" if left else "  control plane, node, pods, mounts, bridge and iptables chains removed"
    )
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
