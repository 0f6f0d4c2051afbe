"""A vLLM engine served on the real node, written once for the three that run it: the serving test
(`realnode/tests/test_serving.py`), `make demo` (`hack/demo.py`) and the start-up bench
(`bench/serving_start.py`).

What a user writes is `deployment()`: the engine's own flags plus two labels and two annotations; the webhook does
the rest (the model volume and STRATA_MODEL_DIR, the connection settings, the node socket, /dev/shm, the scheduling
gate). `s3_pull_deployment()` is the same engine started the way users start it without Strata: an init container
downloads the model from S3 into the pod's own volume, then vLLM loads it from there.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import NODE_NAME
from strata_testsupport.pods import RESTRICTED_CONTAINER, RUNTIME_IMAGE, pod_log
from strata_testsupport.scenarios import Site
from strata_testsupport.vllm import vllm_cpu_python, vllm_env

ENGINE_SCRIPT = Path(__file__).resolve().parents[2] / "kvserver" / "tests" / "vllm" / "cpu_engine.py"
PORT = 8000
SERVED_NAME = "llama"
BLOCK_TOKENS = 32
MAX_MODEL_LEN = 2048

TEST_MODEL = {
    "hidden_size": 768,
    "intermediate_size": 2048,
    "num_attention_heads": 12,
    "num_key_value_heads": 4,
    "head_dim": 64,
    "num_hidden_layers": 8,
    "vocab_size": 32000,
}
"""~100M parameters in float32 (~400 MB): loading is measurable, a 1024-token prefill takes seconds on one core.
Served in float32 (`--dtype float32`), so a prefix computed and the same prefix loaded give the same greedy tokens
(cpu_engine.py says why)."""
MODEL_SHAPES: dict[str, dict[str, Any]] = {
    "test": TEST_MODEL,
    "1g": TEST_MODEL
    | {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 12},
}
"""The benches' models: `1g`, ~250M parameters in float32, ~1 GB of safetensors, so moving the weights is a visible
share of start-up on this machine; `test`, the serving test's ~400 MB model."""


def make_model(path: Path, shape: dict[str, Any]) -> Path:
    """A generated Llama (config, tokenizer, seeded random weights) of `shape` in `path`, by the CPU vLLM venv."""
    done = subprocess.run(
        [str(vllm_cpu_python()), str(ENGINE_SCRIPT), "make-model", str(path), json.dumps(shape)],
        capture_output=True,
        text=True,
        env=vllm_env(),
        timeout=900,
    )
    if done.returncode != 0:
        raise RuntimeError(f"make-model failed:\n{done.stderr[-4000:]}")
    return path


def upload_model_dir(s3: Any, path: Path, bucket: str | None = None, prefix: str = "llama") -> str:
    """Every file of the model directory into a fresh bucket (or `bucket`); returns its s3:// URI."""
    bucket = bucket or s3.create_bucket()
    client = s3.client()
    for file in sorted(p for p in path.iterdir() if p.is_file()):
        client.upload_file(str(file), bucket, f"{prefix}/{file.name}")
    return f"s3://{bucket}/{prefix}"


def tier_spec(chunk_tokens: int, token_secret: str = "kv-token") -> dict[str, Any]:
    """A KVCacheTier on the real node for CPU engines: the node socket with shared memory."""
    return {
        "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
        "l1": {"size": "256Mi"},
        "auth": {"secretRef": {"name": token_secret, "key": "token"}},
        "resources": {"requests": {"cpu": "50m"}},
        "nodeSocket": {"enabled": True, "sharedMemory": True},
        "chunkTokens": chunk_tokens,
        "connector": {"engine": "cpu", "cpuBytes": "64Mi"},
    }


def engine_container(
    image: str, model_dir: str | None = None, load_format: str | None = None, kv_blocks: int | None = None
) -> dict[str, Any]:
    """The vLLM container both deployments run: only where the model is and how it is loaded differ. Without a
    model (Strata's): the webhook adds `--model $(STRATA_MODEL_DIR) --load-format strata` to it. `kv_blocks`: the
    engine's KV memory in blocks of 32 tokens instead of VLLM_CPU_KVCACHE_SPACE's share (small on purpose, so
    users outgrow it; at least MAX_MODEL_LEN's worth)."""
    model = ("--model", model_dir, "--load-format", load_format) if model_dir and load_format else ()
    kv_memory = ("--num-gpu-blocks-override", str(kv_blocks)) if kv_blocks else ()
    return {
        "name": "vllm",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["python3", "-m", "vllm.entrypoints.openai.api_server"],
        "args": [
            *model,
            *("--served-model-name", SERVED_NAME),
            *("--host", "0.0.0.0", "--port", str(PORT), "--seed", "0", "--enable-prompt-tokens-details"),
            # CPU: no compilation, blocks a multiple of 32, a share of host memory checked free at start.
            *("--enforce-eager", "--block-size", str(BLOCK_TOKENS), "--max-model-len", str(MAX_MODEL_LEN)),
            *("--max-num-seqs", "4", "--gpu-memory-utilization", "0.1", *kv_memory),
            # vLLM's `auto` dtype downcasts a float32 checkpoint to bf16, whose logits are so coarse (1/32 apart
            # near 5) that exact ties are common and break differently with the tokens computed per step.
            *("--dtype", "float32"),
        ],
        "env": [{"name": "VLLM_CPU_KVCACHE_SPACE", "value": "1"}],  # GiB
        "securityContext": RESTRICTED_CONTAINER,
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "readinessProbe": {"httpGet": {"path": "/health", "port": PORT}, "periodSeconds": 2},
        "resources": {"requests": {"cpu": "100m", "memory": "1Gi"}},
    }


OWN_SHM = {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}
"""A memory-backed /dev/shm for an engine no KVCacheTier wires (the webhook mounts one with a tier): vLLM's
processes talk through shared memory, more than a container's default 64 MiB."""


def with_own_shm(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod with OWN_SHM mounted at /dev/shm in its engine container."""
    pod["volumes"] = [*pod["volumes"], OWN_SHM]
    (engine,) = pod["containers"]
    engine["volumeMounts"] = [*engine["volumeMounts"], {"name": OWN_SHM["name"], "mountPath": "/dev/shm"}]
    return pod


def _deployment(
    name: str, labels: dict[str, str], annotations: dict[str, str], pod: dict[str, Any], replicas: int = 1
) -> dict[str, Any]:
    pod = {"nodeSelector": {"kubernetes.io/hostname": NODE_NAME}, "terminationGracePeriodSeconds": 30} | pod
    template = {"metadata": {"labels": {"app": name, **labels}, "annotations": annotations}, "spec": pod}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {"replicas": replicas, "selector": {"matchLabels": {"app": name}}, "template": template},
    }


def deployment(
    name: str,
    image: str,
    cache: str,
    tier: str | None,
    annotations: dict[str, str] | None = None,
    replicas: int = 1,
    kv_blocks: int | None = None,
) -> dict[str, Any]:
    """What a user writes with Strata: the engine's own tuning flags and the labels naming the cache (and the
    tier); the webhook adds the model, `--load-format strata`, the tier's (CPU) `--kv-transfer-config` and, unless
    `annotations` opt out (`strata.dev/inject-packages: "false"`), Strata's vLLM packages."""
    labels = {"strata.dev/model-cache": cache}
    if tier:
        labels["strata.dev/kv-cache-tier"] = tier
    pod = {
        "containers": [engine_container(image, kv_blocks=kv_blocks)],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    return _deployment(name, labels, annotations or {}, pod if tier else with_own_shm(pod), replicas)


S3_DOWNLOAD = """
import os, sys, time, boto3
from boto3.s3.transfer import TransferConfig
bucket, prefix = sys.argv[1][len("s3://"):].split("/", 1)
client, started, total = boto3.client("s3"), time.monotonic(), 0
for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix + "/"):
    for item in page.get("Contents", []):
        target = os.path.join("/model", os.path.relpath(item["Key"], prefix))
        client.download_file(bucket, item["Key"], target, Config=TransferConfig())
        total += item["Size"]
print(f"downloaded {total} bytes in {time.monotonic() - started:.2f}s", flush=True)
"""
"""`aws s3 cp --recursive` in a few lines of boto3 (its default multipart, parallel transfer manager): what an
init container does to put a model next to vLLM without Strata."""


def s3_pull_deployment(
    name: str, image: str, uri: str, s3_endpoint: str, s3_secret: str, region: str
) -> dict[str, Any]:
    """The same engine without Strata: an init container (the runtime image, for its boto3) downloads the model
    from S3 into an emptyDir, then vLLM loads it from there with its own safetensors loader."""
    credentials = [
        {"name": key, "valueFrom": {"secretKeyRef": {"name": s3_secret, "key": key}}}
        for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
    ]
    download = {
        "name": "download",
        "image": RUNTIME_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["python3", "-c", S3_DOWNLOAD, uri],
        "env": [
            *credentials,
            {"name": "AWS_ENDPOINT_URL", "value": s3_endpoint},
            {"name": "AWS_REGION", "value": region},
        ],
        "securityContext": RESTRICTED_CONTAINER,
        "volumeMounts": [{"name": "model", "mountPath": "/model"}],
    }
    engine = engine_container(image, "/model", "safetensors")
    engine["volumeMounts"] = [*engine["volumeMounts"], {"name": "model", "mountPath": "/model", "readOnly": True}]
    pod = {
        "initContainers": [download],
        "containers": [engine],
        "volumes": [{"name": "tmp", "emptyDir": {}}, {"name": "model", "emptyDir": {}}],
    }
    return _deployment(name, {}, {}, with_own_shm(pod))


def engine_pods(site: Site, name: str) -> list[dict[str, Any]]:
    """The Deployment's pods that are not being deleted."""
    pods = resource(site.client, "v1", "Pod").get(namespace=site.namespace, label_selector=f"app={name}")
    return [p for p in pods.to_dict()["items"] if not p["metadata"].get("deletionTimestamp")]


def engine_log(site: Site, pod: dict[str, Any]) -> str:
    """The engine's log for a failure message: its error lines (vLLM prints the engine core's root cause well
    above the API server's last traceback), then its end."""
    try:
        text = pod_log(site.client, site.namespace, pod["metadata"]["name"])
    except Exception as error:  # the log is diagnostics only
        return f"(no log: {error})"
    errors = [line for line in text.splitlines() if "Error" in line and not line.lstrip().startswith("File ")]
    return "error lines:\n" + "\n".join(errors[-40:]) + "\n...\n" + text[-4000:]


def _exited(site: Site, pod: dict[str, Any]) -> None:
    """Fail at once, with the log, when a container of the pod ended instead of waiting out the bound."""
    status = pod.get("status", {})
    for container in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
        terminated = (container.get("lastState") or {}).get("terminated") or container["state"].get("terminated")
        if terminated and terminated.get("exitCode", 0) != 0:
            raise AssertionError(f"{container['name']} exited: {terminated}\n" + engine_log(site, pod))


def ready_engine(site: Site, name: str, not_uids: set[str], timeout: float = 1200) -> dict[str, Any]:
    """The Deployment's serving pod once ready (another than `not_uids`); the bound only stops a hang."""

    def ready() -> dict[str, Any] | None:
        for pod in engine_pods(site, name):
            _exited(site, pod)
            statuses = pod.get("status", {}).get("containerStatuses") or []
            if pod["metadata"]["uid"] not in not_uids and statuses and all(s["ready"] for s in statuses):
                return pod
        return None

    return wait_for(ready, timeout=timeout, interval=2, what=f"a ready engine of {name}")


def ready_engines(site: Site, name: str, replicas: int, timeout: float = 1200) -> list[dict[str, Any]]:
    """All `replicas` serving pods of the Deployment once every one is ready; the bound only stops a hang."""

    def ready() -> list[dict[str, Any]] | None:
        pods = engine_pods(site, name)
        for pod in pods:
            _exited(site, pod)
        statuses = [pod.get("status", {}).get("containerStatuses") or [] for pod in pods]
        return pods if len(pods) == replicas and all(s and all(c["ready"] for c in s) for s in statuses) else None

    return wait_for(ready, timeout=timeout, interval=2, what=f"{replicas} ready engines of {name}")


def first_answer(site: Site, name: str, prompt: list[int], timeout: float = 1200) -> tuple[dict[str, Any], float]:
    """Poll the Deployment's pod with a one-token completion from the moment it has an address until it answers;
    returns the pod and the monotonic time of the answer (no readiness-probe period in the measurement)."""

    def answered() -> tuple[dict[str, Any], float] | None:
        for pod in engine_pods(site, name):
            _exited(site, pod)
            if not pod.get("status", {}).get("podIP"):
                continue
            try:
                complete(pod, prompt, max_tokens=1, timeout=60)
            except (urllib.error.URLError, OSError):
                continue
            return pod, time.monotonic()
        return None

    return wait_for(answered, timeout=timeout, interval=0.2, what=f"a first answer from {name}")


def complete(
    pod: dict[str, Any], prompt: list[int], max_tokens: int = 16, salt: str | None = None, timeout: float = 300
) -> dict[str, Any]:
    """One greedy completion from the engine, through the pod's IP (the node's bridge routes it from here).
    `salt` (vLLM's cache_salt) gives the prompt's blocks other hashes: no cache and no tier can serve them."""
    body: dict[str, Any] = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    if salt:
        body["cache_salt"] = salt
    request = urllib.request.Request(
        f"{engine_url(pod)}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        answer: dict[str, Any] = json.loads(response.read())
    return answer


def cached_tokens(answer: dict[str, Any]) -> int:
    return int(((answer.get("usage") or {}).get("prompt_tokens_details") or {}).get("cached_tokens") or 0)


def engine_url(pod: dict[str, Any]) -> str:
    """The engine's OpenAI-compatible server at the pod's IP (the node's bridge routes it from here)."""
    return f"http://{pod['status']['podIP']}:{PORT}"


def metrics_page(pod: dict[str, Any]) -> str:
    """The engine's /metrics, as Prometheus text."""
    with urllib.request.urlopen(f"{engine_url(pod)}/metrics", timeout=30) as response:
        return str(response.read().decode())


def metric(pod: dict[str, Any], name: str) -> float:
    """The sum of a Prometheus series on the engine's /metrics (0 when absent)."""
    text = metrics_page(pod)
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith(name) and (line[len(name)] in " {")
    )


STORED = "vllm:kv_offload_strata_store_chunks_total"
LOADED = "vllm:kv_offload_strata_load_chunks_total"


def stored_chunks_reach(pod: dict[str, Any], least: float) -> float:
    """Wait until the engine reports `least` chunks stored into Strata's tier. Stores finish after the request;
    vLLM reports connector counters with the next engine step, so a one-token request is sent each round."""

    def stored() -> float | None:
        complete(pod, [7], max_tokens=1)
        value = metric(pod, STORED)
        return value if value >= least else None

    return float(wait_for(stored, timeout=180, interval=1, what=f"{least} chunks stored into the tier"))


def fresh_engine(site: Site, name: str, pod: dict[str, Any], seen: set[str]) -> dict[str, Any]:
    """Delete the engine's pod; the Deployment starts another (an empty prefix cache and CPU tier)."""
    seen.add(pod["metadata"]["uid"])
    resource(site.client, "v1", "Pod").delete(name=pod["metadata"]["name"], namespace=site.namespace)
    return ready_engine(site, name, seen)


def delete_deployment(site: Site, name: str, timeout: float = 300) -> None:
    """Delete the Deployment and wait until none of its pods is left (terminating ones included)."""
    resource(site.client, "apps/v1", "Deployment").delete(name=name, namespace=site.namespace)
    pods = resource(site.client, "v1", "Pod")
    wait_for(
        lambda: not pods.get(namespace=site.namespace, label_selector=f"app={name}").items,
        timeout=timeout,
        interval=1,
        what=f"the pods of {name} gone",
    )
