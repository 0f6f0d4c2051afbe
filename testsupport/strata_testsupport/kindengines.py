"""Real vLLM engines on kind's workers (e2e/): the stock vLLM CPU image put into a worker's containerd when its
engine runs there, and the calls a test or a bench makes to engines and KV servers through the API server's pod
proxy (the host has no route to kind's pod network). Shared by e2e/test_engines.py and the scale-out bench
(bench/kind_scaleout.py)."""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
import subprocess
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.usage import parse_metrics

from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import STOCK_VLLM_IMAGE
from strata_testsupport.pods import API, kv_token_secret, model_cache, s3_model_spec
from strata_testsupport.serving import PORT, SERVED_NAME

CHUNK_TOKENS = 128
"""The tiers' chunk: 128 tokens, so that a 1024-token prompt is 8 chunks."""
LONG_PROMPT = [3 + (i * 7919) % 31000 for i in range(1024)]
"""1024 tokens as ids: 8 chunks of the tier, which an engine can load instead of computing."""
MODELS_DIR = "/var/lib/strata/models"
"""Where NodeLocal copies land on the workers (made by `engine_workers`, owned by the loader's uid)."""


class CommandFailed(RuntimeError):
    """A command exited non-zero; the message ends with the last 4000 characters it printed."""


def run(*args: str, timeout: float = 1800, capture: bool = True, **kwargs: Any) -> str:
    """Run a command; its output, or CommandFailed with the end of what it printed (e2e's conftest turns that into
    a test failure)."""
    done = subprocess.run(list(args), capture_output=capture, text=True, timeout=timeout, **kwargs)
    if done.returncode:
        output = (done.stdout or "") + (done.stderr or "")
        raise CommandFailed(f"`{' '.join(args)}` failed ({done.returncode}):\n{output[-4000:]}")
    return done.stdout or ""


@functools.cache
def docker_root() -> str:
    """Where Docker keeps its data (the kind nodes' containerd lives there): the filesystem whose space matters."""
    info = subprocess.run(["docker", "info", "--format", "{{.DockerRootDir}}"], capture_output=True, text=True)
    return info.stdout.strip() or "/"


def disk_free(path: str = "/") -> str:
    """Free space on the filesystem holding `path` (Docker's data, where the nodes' containerd lives), for messages."""
    return f"{shutil.disk_usage(path).free / 1e9:.1f} GB free"


class StockImage:
    """The stock vLLM CPU image in one worker's containerd at a time: its zstd archive streamed into
    `ctr images import` (as `kind load image-archive` imports a plain tar), keeping only the unpacked snapshot
    (`--discard-unpacked-layers` lets the layers' tars go once unpacked), and dropped from a worker once its engine
    has gone. One copy unpacked is about 7.7 GB; two at once did not fit beside a fresh machine's caches."""

    def __init__(self, archive: Path) -> None:
        self.archive, self.ref = archive, STOCK_VLLM_IMAGE
        self.loaded: set[str] = set()

    def ctr(self, worker: str, *args: str) -> str:
        """`ctr` in the worker's containerd, in the namespace the kubelet's images live in."""
        return str(run("docker", "exec", worker, "ctr", "--namespace=k8s.io", *args))

    def load(self, worker: str) -> str:
        """Import the image into `worker`; returns its reference."""
        root = docker_root()
        before, started = shutil.disk_usage(root).used, time.monotonic()
        command = (
            f'zstd -dc "{self.archive}" | docker exec -i {worker} ctr --namespace=k8s.io images import --digests '
            "--snapshotter=overlayfs --local --discard-unpacked-layers -"
        )
        done = subprocess.run(["bash", "-o", "pipefail", "-c", command], capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, (
            f"importing {self.archive} into {worker} failed ({disk_free(root)}):\n{(done.stdout + done.stderr)[-4000:]}"
        )
        self.loaded.add(worker)
        size = run("docker", "exec", worker, "du", "-sh", "/var/lib/containerd").split()[0]
        print(
            f"{self.ref} ({self.archive.stat().st_size / 1e9:.1f} GB archive) imported into {worker} in "
            f"{time.monotonic() - started:.0f}s; disk used +{(shutil.disk_usage(root).used - before) / 1e9:.1f} GB, "
            f"{disk_free(root)}; its /var/lib/containerd: {size}"
        )
        return self.ref

    def drop(self, worker: str) -> None:
        """Remove the image and what it unpacked from `worker`, once the kubelet has removed the containers of the
        engine that ran it (it removes a deleted pod's containers within its minute-long garbage collection)."""
        # Every name the import and the CRI gave the image (its tag, its digests, its config's id) holds its content.
        images = [line.split() for line in self.ctr(worker, "images", "ls").splitlines()[1:]]
        digest = next(image[2] for image in images if image[0] == self.ref)
        names = {image[0] for image in images if image[2] == digest}

        def containers_of_image() -> set[str]:
            listed = [line.split() for line in self.ctr(worker, "containers", "ls").splitlines()[1:]]
            return {row[0] for row in listed if len(row) > 1 and row[1] in names}

        wait_for(
            lambda: not containers_of_image(),
            timeout=300,
            interval=5,
            what=f"the containers of {self.ref} removed from {worker}",
        )
        self.ctr(worker, "images", "rm", "--sync", *sorted(names))
        self.loaded.discard(worker)
        size = run("docker", "exec", worker, "du", "-sh", "/var/lib/containerd").split()[0]
        print(f"{self.ref} dropped from {worker} ({len(names)} names); its /var/lib/containerd: {size}")


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


def complete(
    k8s: Any, pod: dict[str, Any], prompt: list[int], max_tokens: int = 16, timeout: float = 600
) -> dict[str, Any]:
    """One greedy completion, the body strata_testsupport.serving.complete sends."""
    body = {"model": SERVED_NAME, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0}
    answer: dict[str, Any] = json.loads(proxied(k8s, pod, PORT, "v1/completions", body, timeout))
    return answer


def engine_metric(k8s: Any, pod: dict[str, Any], name: str) -> float:
    """The sum of a Prometheus series on the engine's /metrics (0 when absent)."""
    text = proxied(k8s, pod, PORT, "metrics").decode()
    return sum(
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(name) and line[len(name)] in " {"
    )


def servers(k8s: Any, namespace: str, tier: str) -> dict[str, dict[str, Any]]:
    """The tier's server pods by node."""
    listed = resource(k8s, "v1", "Pod").get(namespace=namespace, label_selector=f"app.kubernetes.io/instance={tier}")
    return {p["spec"]["nodeName"]: p for p in listed.to_dict()["items"] if not p["metadata"].get("deletionTimestamp")}


def server_counters(k8s: Any, server: dict[str, Any]) -> dict[str, int]:
    """A KV server's own counters (its /metrics): GETs answered by tier, misses, chunks stored."""
    usage = parse_metrics(proxied(k8s, server, KVCacheTierSpec().metrics_port, "metrics").decode())
    return {
        **{f"hits_{tier}": usage.hits.get(tier, 0) for tier in ("l1", "fs", "s3")},
        "misses": usage.misses,
        "sets": int(usage.samples.get("strata_kv_sets_total", 0)),
    }


def gets(counters: dict[str, int]) -> int:
    """GETs the server answered, hit or miss."""
    return counters["hits_l1"] + counters["hits_fs"] + counters["hits_s3"] + counters["misses"]


def s3_tier(k8s: Any, s3: Any, namespace: str, name: str, *, engines: bool = False) -> tuple[str, str]:
    """A KVCacheTier with the S3 server as its L2 (a server on every worker, the bucket shared by all) and a token
    of its own, its credentials the Secret `s3` (the caller's); `engines`: sized and connected for CPU vLLM engines
    (chunks of CHUNK_TOKENS). Returns the bucket and prefix its chunks land under."""
    bucket, prefix = s3.create_bucket(), "kv"
    kv_token_secret(k8s, namespace)
    spec: dict[str, Any] = {
        "l1": {"size": "256Mi" if engines else "64Mi"},
        "l2": {"s3": {"bucket": bucket, "prefix": prefix, "endpoint": s3.endpoint_url, "secretRef": {"name": "s3"}}},
        "auth": {"secretRef": {"name": "kv-token", "key": "token"}},
        "resources": {"requests": {"cpu": "50m"}},
    }
    if engines:
        spec |= {"chunkTokens": CHUNK_TOKENS, "connector": {"engine": "cpu", "cpuBytes": "64Mi"}}
    body = {"apiVersion": API, "kind": "KVCacheTier", "metadata": {"name": name}, "spec": spec}
    resource(k8s, API, "KVCacheTier").create(namespace=namespace, body=body)
    return bucket, prefix


def written_behind(s3: Any, bucket: str, prefix: str, count: float) -> None:
    """Until `count` chunks are in the bucket (servers write to their L2 behind the client's write)."""
    objects = s3.client()
    wait_for(
        lambda: objects.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0) >= count,
        timeout=120,
        interval=1,
        what=f"{count} chunks written behind to the bucket",
    )


@contextlib.contextmanager
def engine_workers(k8s: Any, workers: dict[str, str], label: str) -> Iterator[None]:
    """The workers labelled `label` (what the engines' and the model's node selectors name), each with the
    directory NodeLocal copies land in; the label is taken off afterwards."""
    nodes = resource(k8s, "v1", "Node")
    try:
        for worker in workers:
            run("docker", "exec", worker, "install", "-d", "-o", "65532", "-g", "65532", MODELS_DIR)
            nodes.patch(name=worker, body={"metadata": {"labels": {label: "true"}}})
        yield
    finally:
        for worker in workers:
            nodes.patch(name=worker, body={"metadata": {"labels": {label: None}}})


def node_local_cache(k8s: Any, s3: Any, namespace: str, name: str, uri: str, label: str) -> None:
    """A NodeLocal ModelCache of the model at `uri` (read with the Secret `s3`) on the workers labelled `label`."""
    bucket, prefix = uri.removeprefix("s3://").split("/", 1)
    spec = s3_model_spec(s3, bucket, prefix, "s3")
    spec["storage"] = {"mode": "NodeLocal", "nodeLocal": {"path": MODELS_DIR, "nodeSelector": {label: "true"}}}
    model_cache(k8s, namespace, name, spec)


def wait_cache_ready(k8s: Any, namespace: str, name: str, nodes: int, timeout: float = 900) -> None:
    """Until the ModelCache is Ready on `nodes` nodes; fails at once when it is Failed."""
    caches = resource(k8s, API, "ModelCache")

    def ready() -> bool:
        status = caches.get(name=name, namespace=namespace).to_dict().get("status") or {}
        assert status.get("phase") != "Failed", status
        return bool(status.get("readyNodes") == nodes and status.get("phase") == "Ready")

    wait_for(ready, timeout=timeout, interval=2, what=f"ModelCache {name} Ready on {nodes} nodes")


def wait_servers_ready(k8s: Any, namespace: str, tier: str, nodes: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Until the tier has a ready server on each of `nodes`; its ready server pods by node."""

    def ready() -> dict[str, dict[str, Any]] | None:
        on = {
            node: pod
            for node, pod in servers(k8s, namespace, tier).items()
            if all(s["ready"] for s in pod.get("status", {}).get("containerStatuses") or [{"ready": False}])
        }
        return on if set(on) >= set(nodes) else None

    what = f"a ready server of {tier} on each of {sorted(nodes)}"
    found: dict[str, dict[str, Any]] = wait_for(ready, timeout=300, interval=2, what=what)
    return found


def fetched_only_from_the_writer(s3: Any, bucket: str, prefix: str, writer: str, reader: str, at_least: float) -> str:
    """From the S3 server's own log: at least `at_least` objects under `bucket/prefix` were fetched, every one of
    them PUT from the `writer` address and fetched from the `reader` address only (a pod's traffic carries its
    node's address). Returns a line saying how many."""
    log = [r for r in s3.requests() if r.path.startswith(f"/{bucket}/{prefix}")]
    put = {r.path for r in log if r.method == "PUT" and r.client == writer}
    fetched = {r.path for r in log if r.method == "GET" and r.status in (200, 206)}
    fetchers = {r.client for r in log if r.method == "GET" and r.status in (200, 206)}
    assert len(fetched) >= at_least and fetched <= put, (sorted(fetched), sorted(put))
    assert fetchers == {reader}, f"objects fetched from {fetchers}, not only from {reader}"
    return f"{len(put)} objects PUT from {writer}, {len(fetched)} fetched from {reader}"
