"""Real vLLM engines sharing KV across kind's workers (e2e/kind-config.yaml): an engine on one worker computes a
long prompt and stores its KV into the KVCacheTier, whose server there writes it behind to the S3 L2; a fresh engine
on the other worker answers the same prompt with that KV, which its own node's server fetched from the bucket.

The engines run the stock vLLM CPU image (`hack/node/build-serving-image.sh stock`: vLLM and nothing of Strata's),
imported into one worker's containerd at a time (the worker whose engine runs), and are wired by labels alone, as
a user wires them: the webhook adds Strata's vLLM packages, the model (a NodeLocal ModelCache with a copy on each
worker) and the KV connection.
Engines and KV servers are reached through the API server's pod proxy (this host has no route to pods)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from strata_testsupport.kindengines import (
    CHUNK_TOKENS,
    LONG_PROMPT,
    complete,
    engine_metric,
    engine_workers,
    fetched_only_from_the_writer,
    gets,
    node_local_cache,
    s3_tier,
    server_counters,
    wait_cache_ready,
    wait_servers_ready,
    written_behind,
)

pytestmark = [pytest.mark.integration, pytest.mark.kind, pytest.mark.timeout(3600)]

ENGINES_LABEL = "strata.dev/e2e-engines"


def test_a_fresh_engine_on_the_other_worker_answers_from_kv_its_own_server_fetched_from_the_bucket(
    k8s_e2e, strata_release, kind_s3, kind_workers, hostpath_namespace, stock_vllm, tmp_path
):
    """Engine A (worker 1) answers a 1024-token prompt and stores its KV into the tier; worker 1's server writes
    it behind to the bucket. Engine A goes; engine B, fresh, on worker 2, answers the same prompt with cached tokens
    loaded from the tier (its connector's load counter) and the same text. Worker 1's server answered no GET while
    B ran; worker 2's server held nothing before B and answered B from the bucket; the S3 log shows every object it
    fetched was PUT from worker 1's address and fetched from worker 2's only. With no L2, B would compute it all."""
    from strata_testsupport.kube import delete_quietly, resource, wait_for
    from strata_testsupport.pods import API, s3_secret
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
    caches = resource(k8s_e2e, API, "ModelCache")
    site = Site(k8s_e2e, namespace, kind_s3.endpoint_url, "s3", shared_pvc=lambda _: {}, region=kind_s3.region)
    with engine_workers(k8s_e2e, kind_workers, ENGINES_LABEL):
        try:
            # -- the model: a NodeLocal copy on each worker (one read of the origin, the other from its peer) ---
            uri = upload_model_dir(kind_s3, make_model(tmp_path / "llama", TEST_MODEL))
            s3_secret(k8s_e2e, namespace, "s3", kind_s3.access_key, kind_s3.secret_key)
            node_local_cache(k8s_e2e, kind_s3, namespace, cache, uri, ENGINES_LABEL)
            kv_bucket, kv_prefix = s3_tier(k8s_e2e, kind_s3, namespace, tier, engines=True)
            wait_cache_ready(k8s_e2e, namespace, cache, len(kind_workers))
            on = wait_servers_ready(k8s_e2e, namespace, tier, kind_workers)

            def engine_on(worker: str, name: str) -> dict[str, Any]:
                """A Deployment wired by its labels only, pinned to `worker`, once the image is in that worker's
                containerd; its ready pod."""
                body = deployment(name, stock_vllm.load(worker), cache, tier)
                body["spec"]["template"]["spec"]["nodeSelector"] = {"kubernetes.io/hostname": worker}
                started = time.monotonic()
                resource(k8s_e2e, "apps/v1", "Deployment").create(namespace=namespace, body=body)
                pod = ready_engine(site, name, set())
                assert pod["spec"]["nodeName"] == worker, pod["spec"]["nodeName"]
                print(f"{name} ready on {worker} {time.monotonic() - started:.0f}s after its Deployment (image loaded)")
                return pod

            # -- engine A on the first worker: computes the prompt, stores its KV into the tier -------------------
            engine_a = engine_on(first, "engine-a")
            answer_a = complete(k8s_e2e, engine_a, LONG_PROMPT)
            text = answer_a["choices"][0]["text"]
            assert answer_a["usage"]["prompt_tokens"] == len(LONG_PROMPT), answer_a["usage"]
            assert cached_tokens(answer_a) == 0, "a fresh engine with an empty tier computes the whole prompt"
            full_chunks = len(LONG_PROMPT) // CHUNK_TOKENS

            def stored() -> float | None:
                complete(k8s_e2e, engine_a, [7], max_tokens=1)  # vLLM reports connector counters with the next step
                value = engine_metric(k8s_e2e, engine_a, STORED)
                return value if value >= full_chunks - 1 else None  # every full chunk; the last may be pending

            stored_by_a = wait_for(stored, timeout=180, interval=1, what=f"{full_chunks - 1} chunks stored by engine A")

            # Worker 1's server holds them and writes them behind; wait until the bucket has every one.
            def held_by_first() -> int | None:
                held = server_counters(k8s_e2e, on[first])["sets"]
                return held if held >= stored_by_a else None

            sets = wait_for(held_by_first, timeout=120, interval=1, what=f"{first}'s server holding A's chunks")
            written_behind(kind_s3, kv_bucket, kv_prefix, sets)
            delete_deployment(site, "engine-a")
            stock_vllm.drop(first)  # one worker's copy at a time

            # -- engine B, fresh, on the second worker: the same prompt, answered from the tier --------------------
            before = {worker: server_counters(k8s_e2e, on[worker]) for worker in kind_workers}
            assert before[second]["sets"] == 0 and gets(before[second]) == 0, f"{second}'s server was used: {before}"
            engine_b = engine_on(second, "engine-b")
            answer_b = complete(k8s_e2e, engine_b, LONG_PROMPT)
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
            addresses = kind_workers[first], kind_workers[second]
            print(fetched_only_from_the_writer(kind_s3, kv_bucket, kv_prefix, *addresses, at_least=loaded))
        finally:
            for name in ("engine-a", "engine-b"):
                delete_quietly(k8s_e2e, "apps/v1", "Deployment", name, namespace)
            # The cache's deletion is refused while a pod names it: the engines' pods go first.
            consumers = f"strata.dev/model-cache={cache}"
            pods = resource(k8s_e2e, "v1", "Pod")
            wait_for(
                lambda: not pods.get(namespace=namespace, label_selector=consumers).items,
                timeout=300,
                interval=2,
                what="the engines' pods gone",
            )
            delete_quietly(k8s_e2e, API, "ModelCache", cache, namespace)
            wait_for(lambda: not caches.get(namespace=namespace).items, timeout=300, interval=2, what="cache gone")
            delete_quietly(k8s_e2e, API, "KVCacheTier", tier, namespace)
