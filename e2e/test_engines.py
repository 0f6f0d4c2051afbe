"""Real vLLM engines sharing KV across kind's workers (e2e/kind-config.yaml): an engine on one worker computes a
long prompt and stores its KV into the KVCacheTier, whose server there writes it behind to the S3 L2; a fresh engine
on the other worker answers the same prompt with that KV, which its own node's server fetched from the bucket.

The engines run the stock vLLM CPU image (`hack/node/build-serving-image.sh stock`: vLLM and nothing of Strata's),
imported into the two workers' containerd only, and are wired by labels alone, as a user wires them: the webhook
adds Strata's vLLM packages, the model (a NodeLocal ModelCache with a copy on each worker) and the KV connection.
Engines and KV servers are reached through the API server's pod proxy (this host has no route to pods)."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.kind, pytest.mark.timeout(3600)]

MODELS_DIR = "/var/lib/strata/models"
ENGINES_LABEL = "strata.dev/e2e-engines"
CHUNK_TOKENS = 128
PROMPT = [3 + (i * 7919) % 31000 for i in range(1024)]
"""1024 tokens as ids: 8 chunks of the tier, which the second engine loads instead of computing."""
IMPORTED = "/var/lib/strata-e2e-images"
"""Where a worker notes which archive it imported (a kept cluster is not loaded twice)."""


def docker_disk_used() -> int:
    """Bytes used on the filesystem holding Docker's data (the nodes' /var volumes live there)."""
    root = subprocess.run(["docker", "info", "--format", "{{.DockerRootDir}}"], capture_output=True, text=True)
    usage = shutil.disk_usage(root.stdout.strip() or "/var/lib/docker")
    return usage.used


@pytest.fixture(scope="module")
def stock_vllm(kind_workers: dict[str, str], e2e: Any) -> str:
    """The stock vLLM CPU image in the two workers' containerd (not the control plane's, not the spare worker's):
    its zstd archive streamed into `ctr images import`, as `kind load image-archive` imports a plain tar, keeping
    only the unpacked snapshot (the layers' tars, as big again, are let go once unpacked)."""
    from strata_testsupport.localcluster.node import STOCK_VLLM_IMAGE, NodeUnavailable, stock_vllm_image_archive

    try:
        archive = stock_vllm_image_archive()
    except NodeUnavailable as error:
        pytest.fail(str(error), pytrace=False)
    marker = f"{IMPORTED}/{archive.name}"
    todo = [w for w in sorted(kind_workers) if subprocess.run(["docker", "exec", w, "test", "-e", marker]).returncode]
    if not todo:
        return STOCK_VLLM_IMAGE
    used, started = docker_disk_used(), time.monotonic()
    importing = {
        worker: subprocess.Popen(
            [
                "bash",
                "-o",
                "pipefail",
                "-c",
                f'zstd -dc "{archive}" | docker exec -i {worker} ctr --namespace=k8s.io images import --digests '
                "--snapshotter=overlayfs --local --discard-unpacked-layers -",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for worker in todo
    }
    for worker, process in importing.items():
        out, _ = process.communicate(timeout=1800)
        assert process.returncode == 0, f"importing {archive} into {worker} failed:\n{out[-4000:]}"
        e2e.run("docker", "exec", worker, "sh", "-c", f"mkdir -p {IMPORTED} && touch {marker}")
    seconds, grown = time.monotonic() - started, docker_disk_used() - used
    sizes = {
        w: e2e.run("docker", "exec", w, "du", "-sh", "/var/lib/containerd").split()[0] for w in sorted(kind_workers)
    }
    print(
        f"{STOCK_VLLM_IMAGE} ({archive.stat().st_size / 1e9:.1f} GB archive) imported into {', '.join(todo)} in "
        f"{seconds:.0f}s; disk used +{grown / 1e9:.1f} GB; each worker's /var/lib/containerd: {sizes}"
    )
    return STOCK_VLLM_IMAGE


# -- engines and servers, through the API server's pod proxy -----------------------------------------------------
def proxied(k8s: Any, pod: dict[str, Any], port: int, path: str, body: Any = None, timeout: float = 600) -> bytes:
    """A GET (or, with `body`, a JSON POST) to the pod's `port`, proxied by the API server."""
    meta = pod["metadata"]
    response = k8s.client.call_api(
        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}:{port}/proxy/{path}",
        "GET" if body is None else "POST",
        header_params={"Content-Type": "application/json", "Accept": "*/*"},
        body=body,
        auth_settings=["BearerToken"],
        _preload_content=False,
        _return_http_data_only=True,
        _request_timeout=timeout,
    )
    return bytes(response.data)


def complete(k8s: Any, pod: dict[str, Any], prompt: list[int], max_tokens: int = 16) -> dict[str, Any]:
    """One greedy completion, the body strata_testsupport.serving.complete sends."""
    from strata_testsupport.serving import PORT, SERVED_NAME

    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    answer: dict[str, Any] = json.loads(proxied(k8s, pod, PORT, "v1/completions", body))
    return answer


def engine_metric(k8s: Any, pod: dict[str, Any], name: str) -> float:
    """The sum of a Prometheus series on the engine's /metrics (0 when absent)."""
    from strata_testsupport.serving import PORT

    text = proxied(k8s, pod, PORT, "metrics").decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name) and line[len(name)] in " {"
    )


def servers(k8s: Any, namespace: str, tier: str) -> dict[str, dict[str, Any]]:
    """The tier's server pods by node."""
    from strata_testsupport.kube import resource

    listed = resource(k8s, "v1", "Pod").get(namespace=namespace, label_selector=f"app.kubernetes.io/instance={tier}")
    return {p["spec"]["nodeName"]: p for p in listed.to_dict()["items"] if not p["metadata"].get("deletionTimestamp")}


def server_counters(k8s: Any, server: dict[str, Any]) -> dict[str, int]:
    """A KV server's own counters (its /metrics): GETs answered by tier, misses, chunks stored."""
    from strata_operator.api.kvcachetier import KVCacheTierSpec
    from strata_operator.resources.kvcachetier.usage import parse_metrics

    usage = parse_metrics(proxied(k8s, server, KVCacheTierSpec().metrics_port, "metrics").decode())
    return {
        **{f"hits_{tier}": usage.hits.get(tier, 0) for tier in ("l1", "fs", "s3")},
        "misses": usage.misses,
        "sets": int(usage.samples.get("strata_kv_sets_total", 0)),
    }


def gets(counters: dict[str, int]) -> int:
    """GETs the server answered, hit or miss."""
    return counters["hits_l1"] + counters["hits_fs"] + counters["hits_s3"] + counters["misses"]


def cpu_tier(k8s: Any, s3: Any, namespace: str, name: str) -> tuple[str, str]:
    """A KVCacheTier for CPU engines with the S3 server as its L2 (a server on every worker, the bucket shared by
    all), reached through the node-local Service; returns the bucket and prefix its chunks land under."""
    from strata_testsupport.kube import resource
    from strata_testsupport.pods import API, kv_token_secret

    bucket, prefix = s3.create_bucket(), "kv"
    kv_token_secret(k8s, namespace)
    spec = {
        "l1": {"size": "256Mi"},
        "l2": {"s3": {"bucket": bucket, "prefix": prefix, "endpoint": s3.endpoint_url, "secretRef": {"name": "s3"}}},
        "auth": {"secretRef": {"name": "kv-token", "key": "token"}},
        "resources": {"requests": {"cpu": "50m"}},
        "chunkTokens": CHUNK_TOKENS,
        "connector": {"engine": "cpu", "cpuBytes": "64Mi"},
    }
    body = {"apiVersion": API, "kind": "KVCacheTier", "metadata": {"name": name}, "spec": spec}
    resource(k8s, API, "KVCacheTier").create(namespace=namespace, body=body)
    return bucket, prefix


def test_a_fresh_engine_on_the_other_worker_answers_from_kv_its_own_server_fetched_from_the_bucket(
    k8s_e2e, strata_release, kind_s3, kind_workers, hostpath_namespace, stock_vllm, tmp_path, e2e
):
    """Engine A (worker 1) answers a 1024-token prompt and stores its KV into the tier; worker 1's server writes
    it behind to the bucket. Engine A goes; engine B, fresh, on worker 2, answers the same prompt with cached tokens
    loaded from the tier (its connector's load counter) and the same text. Worker 1's server answered no GET while
    B ran; worker 2's server held nothing before B and answered B from the bucket; the S3 log shows every object it
    fetched was PUT from worker 1's address and fetched from worker 2's only. With no L2, B would compute it all."""
    from strata_testsupport.kube import delete_quietly, resource, wait_for
    from strata_testsupport.pods import API, model_cache, s3_model_spec, s3_secret
    from strata_testsupport.scenarios import Site
    from strata_testsupport.serving import (
        LOADED,
        STORED,
        TEST_MODEL,
        cached_tokens,
        delete_deployment,
        deployment,
        engine_log,
        make_model,
        ready_engine,
        upload_model_dir,
    )

    namespace, cache, tier = hostpath_namespace, "llama", "engines-kv"
    first, second = sorted(kind_workers)
    nodes, caches = resource(k8s_e2e, "v1", "Node"), resource(k8s_e2e, API, "ModelCache")
    site = Site(k8s_e2e, namespace, kind_s3.endpoint_url, "s3", shared_pvc=lambda _: {}, region=kind_s3.region)
    try:
        # -- the model: a NodeLocal copy on each worker (one read of the origin, the other from its peer) -----
        for worker in kind_workers:
            e2e.run("docker", "exec", worker, "install", "-d", "-o", "65532", "-g", "65532", MODELS_DIR)
            nodes.patch(name=worker, body={"metadata": {"labels": {ENGINES_LABEL: "true"}}})
        uri = upload_model_dir(kind_s3, make_model(tmp_path / "llama", TEST_MODEL))
        s3_secret(k8s_e2e, namespace, "s3", kind_s3.access_key, kind_s3.secret_key)
        bucket, prefix = uri.removeprefix("s3://").split("/", 1)
        spec = s3_model_spec(kind_s3, bucket, prefix, "s3")
        spec["storage"] = {
            "mode": "NodeLocal",
            "nodeLocal": {"path": MODELS_DIR, "nodeSelector": {ENGINES_LABEL: "true"}},
        }
        model_cache(k8s_e2e, namespace, cache, spec)
        kv_bucket, kv_prefix = cpu_tier(k8s_e2e, kind_s3, namespace, tier)

        def cache_ready() -> bool:
            status = caches.get(name=cache, namespace=namespace).to_dict().get("status") or {}
            assert status.get("phase") != "Failed", status
            return status.get("readyNodes") == 2 and status.get("phase") == "Ready"

        wait_for(cache_ready, timeout=900, interval=2, what=f"ModelCache {cache} Ready on both workers")
        wait_for(
            lambda: (
                set(servers(k8s_e2e, namespace, tier)) >= set(kind_workers)
                and all(
                    all(s["ready"] for s in p.get("status", {}).get("containerStatuses") or [{"ready": False}])
                    for p in servers(k8s_e2e, namespace, tier).values()
                )
            ),
            timeout=300,
            interval=2,
            what=f"a ready server of {tier} on each worker",
        )
        on = servers(k8s_e2e, namespace, tier)

        def engine_on(worker: str, name: str) -> dict[str, Any]:
            """A Deployment wired by its labels only, pinned to `worker`; its ready pod."""
            body = deployment(name, stock_vllm, cache, tier)
            body["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": worker}
            resource(k8s_e2e, "apps/v1", "Deployment").create(namespace=namespace, body=body)
            pod = ready_engine(site, name, set())
            assert pod["spec"]["nodeName"] == worker, pod["spec"]["nodeName"]
            return pod

        # -- engine A on the first worker: computes the prompt, stores its KV into the tier -------------------
        started = time.monotonic()
        engine_a = engine_on(first, "engine-a")
        print(f"engine A ready on {first} in {time.monotonic() - started:.0f}s")
        answer_a = complete(k8s_e2e, engine_a, PROMPT)
        text = answer_a["choices"][0]["text"]
        assert answer_a["usage"]["prompt_tokens"] == len(PROMPT), answer_a["usage"]
        assert cached_tokens(answer_a) == 0, "a fresh engine with an empty tier computes the whole prompt"
        full_chunks = len(PROMPT) // CHUNK_TOKENS

        def stored() -> float | None:
            complete(k8s_e2e, engine_a, [7], max_tokens=1)  # vLLM reports connector counters with the next step
            value = engine_metric(k8s_e2e, engine_a, STORED)
            return value if value >= full_chunks - 1 else None  # every full chunk; the last may be pending

        stored_by_a = wait_for(stored, timeout=180, interval=1, what=f"{full_chunks - 1} chunks stored by engine A")
        # Worker 1's server holds them and writes them behind; wait until the bucket has every one.
        sets = wait_for(
            lambda: server_counters(k8s_e2e, on[first])["sets"] >= stored_by_a and server_counters(k8s_e2e, on[first]),
            timeout=120,
            interval=1,
            what=f"{first}'s server holding engine A's chunks",
        )["sets"]
        objects = kind_s3.client()
        wait_for(
            lambda: objects.list_objects_v2(Bucket=kv_bucket, Prefix=kv_prefix).get("KeyCount", 0) >= sets,
            timeout=120,
            interval=1,
            what=f"{sets} chunks written behind to the bucket",
        )
        delete_deployment(site, "engine-a")

        # -- engine B, fresh, on the second worker: the same prompt, answered from the tier --------------------
        before = {worker: server_counters(k8s_e2e, on[worker]) for worker in kind_workers}
        assert before[second]["sets"] == 0 and gets(before[second]) == 0, f"{second}'s server was used: {before}"
        started = time.monotonic()
        engine_b = engine_on(second, "engine-b")
        print(f"engine B ready on {second} in {time.monotonic() - started:.0f}s")
        answer_b = complete(k8s_e2e, engine_b, PROMPT)
        complete(k8s_e2e, engine_b, [7], max_tokens=1)  # the counters of the step before
        loaded = engine_metric(k8s_e2e, engine_b, LOADED)
        after = {worker: server_counters(k8s_e2e, on[worker]) for worker in kind_workers}
        print(
            f"engine A: {stored_by_a:.0f} chunks stored, {sets} on {first}'s server; engine B: cached_tokens="
            f"{cached_tokens(answer_b)}, chunks loaded={loaded:.0f}; servers before B {before}, after {after}"
        )
        why = f"no tokens from the tier: {answer_b['usage']}"
        # Every chunk but (at most) the last, pending one was in the bucket before B started.
        assert cached_tokens(answer_b) >= (full_chunks - 1) * CHUNK_TOKENS, f"{why}\n{engine_log(site, engine_b)}"
        assert loaded >= full_chunks - 1, "the cached tokens came from Strata's tier (the connector's load counter)"
        assert answer_b["choices"][0]["text"] == text, "loaded KV gives the text computed KV gave"

        # -- node-locality: the servers' own counters and the S3 server's log -----------------------------------
        assert gets(after[first]) == gets(before[first]), f"{first}'s server answered GETs while B ran: {after}"
        assert after[second]["hits_s3"] >= loaded, f"{second}'s server did not answer B from the bucket: {after}"
        log = [r for r in kind_s3.requests() if r.path.startswith(f"/{kv_bucket}/{kv_prefix}")]
        put = {r.path for r in log if r.method == "PUT" and r.client == kind_workers[first]}
        fetched = {r.path for r in log if r.method == "GET" and r.status in (200, 206)}
        fetchers = {r.client for r in log if r.method == "GET" and r.status in (200, 206)}
        assert len(fetched) >= loaded and fetched <= put, (sorted(fetched), sorted(put))
        assert fetchers == {kind_workers[second]}, f"objects fetched from {fetchers}, not only {second}'s address"
        print(f"{len(put)} objects PUT from {first}, {len(fetched)} fetched from {second}")
    finally:
        for name in ("engine-a", "engine-b"):
            delete_quietly(k8s_e2e, "apps/v1", "Deployment", name, namespace)
        delete_quietly(k8s_e2e, API, "ModelCache", cache, namespace)
        wait_for(lambda: not caches.get(namespace=namespace).items, timeout=300, interval=2, what="the cache deleted")
        delete_quietly(k8s_e2e, API, "KVCacheTier", tier, namespace)
        for worker in kind_workers:
            nodes.patch(name=worker, body={"metadata": {"labels": {ENGINES_LABEL: None}}})
