"""KV follows the model revision, on the real node, with the operator the chart installed: a ModelCache's two
revisions served side by side through one KVCacheTier never share a block, and once the old revision's pods are
gone the tier drops its namespace from the server (L1 and the L2 directory on the node's volume), reporting the
bytes it freed.

The serving pods are real clients, not vLLM engines: labelled with the cache and the tier and nothing else, wired
by the webhook (model mount, STRATA_MODEL_DIR, connection settings, token), each computes its namespace from
STRATA_MODEL_DIR as vLLM's FileMapper does (`<model with / as _>_<sha256 of the layout fields>[:12]_r0/`), stores
the same block hashes with bytes that depend on the weights it mounted, reads them back, and keeps running (a pod
that serves). vLLM engines on CPU take minutes each to start here; the namespace they compute is the same
function of the model path (see docs/serving.md: KV follows the model revision).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.pods import (
    API,
    RESTRICTED_CONTAINER,
    TOKEN,
    cache_status,
    kv_tier_spec,
    kv_token_secret,
    pod_log,
    rwx_claim,
    unique,
    upload_model,
)
from strata_testsupport.scenarios import pod_placement, preload_from_s3, ready_server

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

BLOCKS = 24
ENGINE = """
import hashlib, json, os, sys, time, urllib.parse
from strata_kv.client import KVClient
model = os.environ["STRATA_MODEL_DIR"]
weights = hashlib.sha256()
for root, dirs, files in sorted(os.walk(model)):
    for name in sorted(files):
        with open(os.path.join(root, name), "rb") as f:
            weights.update(f.read())
# vLLM 0.33's FileMapper: the model name (the --model path) and the KV layout, sorted compact JSON, sha256[:12].
fields = {"model_name": model, "tokens_per_hash": 64, "blocks_per_file": 1, "tp_size": 1, "pp_size": 1,
          "pcp_size": 1, "dcp_size": 1, "dtype": "bfloat16", "inference_engine": "vllm",
          "kv_cache_groups": [{"tokens_per_block": 64, "layer_names": ["model.layers.0.self_attn.attn"]}]}
digest = hashlib.sha256(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:12]
namespace = f"{model.replace('/', '_')}_{digest}"
url = urllib.parse.urlparse(os.environ["STRATA_KV_URL"])
deadline = time.monotonic() + 60
while True:
    try:
        kv = KVClient(url.hostname, url.port, token=os.environ["STRATA_KV_TOKEN"], timeout=20)
        kv.ping()
        break
    except ConnectionRefusedError:
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
same = True
for i in range(int(sys.argv[1])):
    block_hash = hashlib.sha256(b"prompt-block-" + str(i).encode()).digest()[:16]  # the same prompt for every revision
    key = f"{namespace}_r0/".encode() + block_hash + (0).to_bytes(4, "big")
    value = hashlib.sha256(weights.digest() + block_hash).digest() * 1024  # 32 KiB computed with these weights
    kv.set(key, value)
    same &= kv.get(key) == value
print(json.dumps({"namespace": namespace, "model": model, "weights": weights.hexdigest(), "same": same}), flush=True)
time.sleep(86400)
"""


def engine_pod(site: Any, name: str, cache: str, tier: str) -> dict[str, Any]:
    """Create a serving pod labelled with the cache and tier; wait for its line; return it with the pod."""
    labels = {"strata.dev/model-cache": cache, "strata.dev/kv-cache-tier": tier}
    container = {
        "name": "engine",
        "image": pod_placement(site)["image"],
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-c", ENGINE, str(BLOCKS)],
        "securityContext": RESTRICTED_CONTAINER,
    }
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels},
        "spec": {"restartPolicy": "Never", "containers": [container], **_placement(site)},
    }
    resource(site.client, "v1", "Pod").create(namespace=site.namespace, body=body)

    def reported() -> dict[str, Any] | None:
        phase = resource(site.client, "v1", "Pod").get(name=name, namespace=site.namespace).status.phase
        assert phase not in ("Failed", "Succeeded"), pod_log(site.client, site.namespace, name)
        if phase != "Running":
            return None
        lines = [ln for ln in pod_log(site.client, site.namespace, name).splitlines() if ln.startswith("{")]
        return dict(json.loads(lines[-1])) if lines else None

    result = wait_for(reported, timeout=300, interval=1, what=f"serving pod {name} to store its blocks")
    result["pod"] = resource(site.client, "v1", "Pod").get(name=name, namespace=site.namespace).to_dict()
    return result


def _placement(site: Any) -> dict[str, Any]:
    return {k: v for k, v in pod_placement(site).items() if k != "image"}


def tier_status(site: Any, tier: str) -> dict[str, Any]:
    return dict(resource(site.client, API, "KVCacheTier").get(name=tier, namespace=site.namespace).to_dict()["status"])


@pytest.mark.timeout(1500)
def test_two_revisions_never_share_blocks_and_the_old_ones_are_collected(node_site, node_s3) -> None:
    site, cache, tier = node_site, unique("llama"), unique("kv")
    bucket = node_s3.create_bucket()
    kv_token_secret(site.client, site.namespace)
    claim = f"{tier}-l2"
    l2: Path = rwx_claim(site.client, site.namespace, claim)
    spec = {**kv_tier_spec(claim), "namespaceCollection": {"gracePeriodSeconds": 0}}
    resource(site.client, API, "KVCacheTier").create(
        namespace=site.namespace,
        body={"apiVersion": API, "kind": "KVCacheTier", "metadata": {"name": tier}, "spec": spec},
    )
    server = ready_server(site, tier)

    # -- revision A served --------------------------------------------------------------------------------------
    upload_model(node_s3, bucket, "llama", files=1, tensor_bytes=1 << 18)
    first = preload_from_s3(site, cache, f"s3://{bucket}/llama")
    old = engine_pod(site, unique("old"), cache, tier)
    assert old["same"], old
    revision_a = first["manifestSha256"].removeprefix("sha256:")[:12]
    assert old["model"].endswith(f"/rev-{revision_a}"), old["model"]
    assert old["pod"]["metadata"]["annotations"]["strata.dev/model-revision"] == revision_a

    # -- the cache moves to revision B (other weights under the same URI); B served beside A -------------------
    upload_model(node_s3, bucket, "llama", files=1, tensor_bytes=1 << 17)
    resource(site.client, API, "ModelCache").patch(
        name=cache,
        namespace=site.namespace,
        body={"spec": {"source": {"revision": "b"}}},
        content_type="application/merge-patch+json",
    )

    def moved() -> dict[str, Any] | None:
        status = cache_status(site.client, site.namespace, cache)
        ready = status.get("phase") == "Ready" and status.get("manifestSha256") not in (None, first["manifestSha256"])
        return status if ready else None

    second = wait_for(moved, timeout=600, interval=2, what="the cache's second revision Ready")
    new = engine_pod(site, unique("new"), cache, tier)
    revision_b = second["manifestSha256"].removeprefix("sha256:")[:12]
    assert new["model"].endswith(f"/rev-{revision_b}") and new["weights"] != old["weights"], (old, new)
    assert new["same"] and new["namespace"] != old["namespace"], "same block hashes, other weights: other keys"

    kv = redis.Redis(host=server["status"]["podIP"], port=6379, password=TOKEN, socket_timeout=30)
    held = json.loads(kv.execute_command("STRATA.NAMESPACES"))
    assert held[old["namespace"]]["l1"]["blocks"] == BLOCKS and held[new["namespace"]]["l1"]["blocks"] == BLOCKS
    wait_for(
        lambda: (
            json.loads(kv.execute_command("STRATA.NAMESPACES"))[old["namespace"]].get("fs", {}).get("blocks") == BLOCKS
        ),
        timeout=60,
        what="the old revision's blocks written behind to L2",
    )
    old_dirs = sorted(p.name for p in l2.glob(old["namespace"] + "_r*"))
    new_dirs = sorted(p.name for p in l2.glob(new["namespace"] + "_r*"))
    assert old_dirs and new_dirs and not set(old_dirs) & set(new_dirs)
    old_files = {p.relative_to(l2 / old_dirs[0]) for p in (l2 / old_dirs[0]).rglob("*.bin")}
    new_files = {p.relative_to(l2 / new_dirs[0]) for p in (l2 / new_dirs[0]).rglob("*.bin")}
    assert old_files == new_files and len(old_files) == BLOCKS, "the same block hashes, each in its own namespace"

    def both_served() -> dict[str, Any] | None:  # the tier's next reconcile (at most its resync) lists the pods
        records = {r["revision"]: r["servingPods"] for r in tier_status(site, tier).get("namespaces") or []}
        return records if records.get(revision_a) == 1 and records.get(revision_b) == 1 else None

    wait_for(both_served, timeout=180, interval=2, what="status.namespaces listing both revisions' pods")

    # -- the old revision's pod goes: its namespace is dropped from L1 and L2, the bytes reported --------------
    held = json.loads(kv.execute_command("STRATA.NAMESPACES"))[old["namespace"]]
    expected = sum(t["bytes"] for t in held.values())
    resource(site.client, "v1", "Pod").delete(
        name=old["pod"]["metadata"]["name"], namespace=site.namespace, body={"gracePeriodSeconds": 0}
    )

    def collected() -> list[dict[str, Any]] | None:
        entries = [c for c in tier_status(site, tier).get("collectedNamespaces") or [] if c["revision"] == revision_a]
        return entries or None

    (entry,) = wait_for(collected, timeout=300, interval=2, what="the old revision's namespace collected")
    print(f"collected {entry['namespace']}: {entry['blocks']} blocks, {entry['freedBytes']} bytes")
    assert entry["namespace"] == old["namespace"]
    assert entry["freedBytes"] == expected and entry["blocks"] == 2 * BLOCKS  # each block in L1 and in L2
    assert not list(l2.glob(old["namespace"] + "*")), "the old revision's L2 directory is gone"
    assert sorted(p.name for p in l2.glob(new["namespace"] + "_r*")) == new_dirs
    listed = json.loads(kv.execute_command("STRATA.NAMESPACES"))
    assert old["namespace"] not in listed and listed[new["namespace"]]["fs"]["blocks"] == BLOCKS
    events = resource(site.client, "v1", "Event").get(
        namespace=site.namespace, field_selector=f"involvedObject.name={tier},reason=NamespaceCollected"
    )
    assert any(f"freed {expected} bytes" in e.message for e in events.items), [e.message for e in events.items]
    assert [r["revision"] for r in tier_status(site, tier)["namespaces"]] == [revision_b]
