"""The collection of an old model revision's KV namespaces against the real local control plane and real KV
server processes: the tier's reconcile lists the pods wired to it, keeps a revision that pods still serve, and
once the cache has moved on and the old revision's pods are gone, drops its namespaces from every server (a server
that is not ready leaves the record pending until it is), reporting the bytes freed.

No kubelet runs here: the two servers' pods are API objects whose status says Ready at 127.0.0.1 and 127.0.0.2,
where real `strata-kv serve` processes listen on the tier's port; the serving pods are gated (never scheduled),
annotated as the webhook annotates them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from kubernetes.dynamic import DynamicClient
from strata_operator.api import API_VERSION
from strata_operator.handlers.kvcachetier import io
from strata_operator.handlers.kvcachetier import reconcile as reconciler
from strata_operator.resources.kvcachetier import namespaces as ns
from strata_operator.resources.kvcachetier.names import TierRef
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.kvserver import KVServerProcess, running_kv_server
from strata_testsupport.processes import free_port

pytestmark = pytest.mark.integration

TOKEN = "collect-me"
OLD, NEW = "a1" * 20, "b2" * 20
DIGEST = "0123456789ab"  # vLLM's layout digest part of a namespace name
BLOCK = 8 * 1024


def model_of(revision: str) -> str:
    return f"/models/llama/rev-{revision[:12]}"


def namespace_of(model: str) -> str:
    return f"{model.replace('/', '_')}_{DIGEST}"


def key(model: str, i: int) -> bytes:
    return f"{namespace_of(model)}_r0/".encode() + i.to_bytes(16, "big") + (0).to_bytes(4, "big")


@pytest.fixture
def servers(tmp_path: Path) -> Iterator[tuple[int, list[KVServerProcess]]]:
    """Two servers with node-local L2 directories, on one port at two loopback addresses, sharing a token."""
    port = free_port()
    token = tmp_path / "token"
    token.write_text(TOKEN)
    with (
        running_kv_server(tmp_path / "a", _config(port, "127.0.0.1", token), l2_fs=True) as a,
        running_kv_server(tmp_path / "b", _config(port, "127.0.0.2", token), l2_fs=True) as b,
    ):
        yield port, [a, b]


def _config(port: int, bind: str, token: Path) -> dict[str, Any]:
    return {"listen": {"port": port, "bind": bind, "unix_socket": None}, "auth": {"token_file": str(token)}}


def client(server: KVServerProcess, host: str, port: int) -> redis.Redis:
    return redis.Redis(host=host, port=port, password=TOKEN, socket_timeout=30)


def create(k8s: DynamicClient, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
    return dict(resource(k8s, body["apiVersion"], body["kind"]).create(body=body, namespace=namespace).to_dict())


def server_pod(k8s: DynamicClient, namespace: str, tier: TierRef, name: str, ip: str, ready: bool) -> None:
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": tier.selector_labels()},
        "spec": {"schedulingGates": [{"name": "test/never"}], "containers": [{"name": "kv", "image": "kv"}]},
    }
    create(k8s, namespace, body)
    set_ready(k8s, namespace, name, ip, ready)


def set_ready(k8s: DynamicClient, namespace: str, name: str, ip: str, ready: bool) -> None:
    status = {
        "phase": "Running",
        "podIP": ip,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
    }
    resource(k8s, "v1", "Pod").status.patch(
        name=name,
        namespace=namespace,
        body={"status": status},
        content_type="application/merge-patch+json",
    )


def serving_pod(k8s: DynamicClient, namespace: str, name: str, revision: str) -> None:
    """A pod as the webhook leaves it: labelled for the tier, annotated with cache, revision and model name."""
    annotations = {
        ns.MODEL_CACHE_ANNOTATION: "llama",
        ns.REVISION_ANNOTATION: revision[:12],
        ns.KV_MODEL_ANNOTATION: model_of(revision),
    }
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"strata.dev/kv-cache-tier": "kv"}, "annotations": annotations},
        "spec": {"schedulingGates": [{"name": "test/never"}], "containers": [{"name": "vllm", "image": "vllm"}]},
    }
    create(k8s, namespace, body)


def cache_moves_to(k8s: DynamicClient, namespace: str, revision: str) -> None:
    resource(k8s, API_VERSION, "ModelCache").status.patch(
        name="llama",
        namespace=namespace,
        body={"status": {"resolvedRevision": revision}},
        content_type="application/merge-patch+json",
    )


def tier_now(k8s: DynamicClient, namespace: str) -> dict[str, Any]:
    return dict(resource(k8s, API_VERSION, "KVCacheTier").get(name="kv", namespace=namespace).to_dict())


def test_an_old_revisions_namespaces_are_dropped_from_every_server_once_no_pod_serves_it(
    k8s: DynamicClient, namespace: str, strata_crds: Any, servers: tuple[int, list[KVServerProcess]]
) -> None:
    port, (a, b) = servers
    secret = {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kv-token"}}
    create(k8s, namespace, {**secret, "data": {"token": base64.b64encode(TOKEN.encode()).decode()}})
    cache = {"source": {"uri": "hf://org/llama"}, "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}}}
    create(
        k8s, namespace, {"apiVersion": API_VERSION, "kind": "ModelCache", "metadata": {"name": "llama"}, "spec": cache}
    )
    cache_moves_to(k8s, namespace, OLD)
    spec = {
        "nodeSelector": {"strata.test/none": namespace},
        "port": port,
        "auth": {"secretRef": {"name": "kv-token"}},
        "namespaceCollection": {"gracePeriodSeconds": 0},
    }
    created = create(
        k8s, namespace, {"apiVersion": API_VERSION, "kind": "KVCacheTier", "metadata": {"name": "kv"}, "spec": spec}
    )
    tier = TierRef.from_body(created)
    server_pod(k8s, namespace, tier, "kv-a", "127.0.0.1", ready=True)
    server_pod(k8s, namespace, tier, "kv-b", "127.0.0.2", ready=True)

    clients = [client(a, "127.0.0.1", port), client(b, "127.0.0.2", port)]
    foreign = "/elsewhere/other-model"  # written by nobody Strata wired: never touched
    for c in clients:
        for i in range(12):
            for model in (model_of(OLD), model_of(NEW), foreign):
                c.set(key(model, i), bytes([i]) * BLOCK)
    serving_pod(k8s, namespace, "old-0", OLD)
    serving_pod(k8s, namespace, "new-0", NEW)

    # Both revisions served: both tracked, nothing dropped, even with the cache moved on and no grace period.
    cache_moves_to(k8s, namespace, NEW)
    reconciler.reconcile(tier_now(k8s, namespace))
    records = {r["revision"]: r for r in tier_now(k8s, namespace)["status"]["namespaces"]}
    assert {r: records[r]["servingPods"] for r in records} == {OLD[:12]: 1, NEW[:12]: 1}
    assert all(c.get(key(model_of(OLD), 3)) == bytes([3]) * BLOCK for c in clients)

    # The old revision's pod goes while server b is not ready: a collects, b stays pending.
    held = [json.loads(c.execute_command("STRATA.NAMESPACES")) for c in clients]
    old_bytes = [h[namespace_of(model_of(OLD))] for h in held]
    expected = sum(t["bytes"] for h in old_bytes for t in h.values())
    set_ready(k8s, namespace, "kv-b", "127.0.0.2", ready=False)
    resource(k8s, "v1", "Pod").delete(name="old-0", namespace=namespace, body={"gracePeriodSeconds": 0})
    reconcile_until(k8s, namespace, lambda t: bool(_pending(t)), "the old revision's collection pending on b")
    assert _pending(tier_now(k8s, namespace)).endswith("retried: kv-b: not ready")
    assert namespace_of(model_of(OLD)) not in json.loads(clients[0].execute_command("STRATA.NAMESPACES"))
    assert namespace_of(model_of(OLD)) in json.loads(clients[1].execute_command("STRATA.NAMESPACES"))

    # b is back: the next reconcile finishes; every byte the servers held for the old revision is reported freed.
    set_ready(k8s, namespace, "kv-b", "127.0.0.2", ready=True)
    reconcile_until(k8s, namespace, lambda t: not _records(t, OLD), "the old revision collected everywhere")
    status = tier_now(k8s, namespace)["status"]
    collected = [c for c in status["collectedNamespaces"] if c["revision"] == OLD[:12]]
    assert {c["namespace"] for c in collected} == {namespace_of(model_of(OLD))}
    assert sum(c["freedBytes"] for c in collected) == expected
    assert sum(c["blocks"] for c in collected) == 2 * 12 * 2  # 12 blocks in L1 and in L2, on two servers
    for server, c in zip((a, b), clients, strict=True):
        listed = json.loads(c.execute_command("STRATA.NAMESPACES"))
        assert namespace_of(model_of(OLD)) not in listed
        assert listed[namespace_of(model_of(NEW))]["fs"]["blocks"] == 12
        assert listed[namespace_of(foreign)]["fs"]["blocks"] == 12
        l2 = Path(server.config["l2"]["fs"]["root_dir"])
        assert not list(l2.glob(namespace_of(model_of(OLD)) + "*"))
        assert c.get(key(model_of(NEW), 5)) == bytes([5]) * BLOCK
    assert [r["revision"] for r in status["namespaces"]] == [NEW[:12]]

    # The cache's current revision keeps its KV even with no pod serving it (scaled to zero, say).
    resource(k8s, "v1", "Pod").delete(name="new-0", namespace=namespace, body={"gracePeriodSeconds": 0})
    reconcile_until(k8s, namespace, lambda t: bool(_records(t, NEW)) and not _records(t, NEW)[0]["servingPods"], "idle")
    reconciler.reconcile(tier_now(k8s, namespace))
    assert all(c.get(key(model_of(NEW), 5)) == bytes([5]) * BLOCK for c in clients)


def reconcile_until(k8s: DynamicClient, namespace: str, done: Callable[[dict[str, Any]], bool], what: str) -> None:
    """Reconcile until the stored tier shows `done` (an operator running in the same session may do it first)."""

    def settled() -> bool:
        if done(tier_now(k8s, namespace)):
            return True
        reconciler.reconcile(tier_now(k8s, namespace))
        return done(tier_now(k8s, namespace))

    wait_for(settled, timeout=30, what=what)


def _records(tier: dict[str, Any], revision: str) -> list[dict[str, Any]]:
    return [r for r in (tier.get("status") or {}).get("namespaces") or [] if r["revision"] == revision[:12]]


def _pending(tier: dict[str, Any]) -> str:
    return next((r.get("pending") or "" for r in _records(tier, OLD)), "")


def test_two_reconciles_that_collect_at_once_both_keep_their_freed_bytes_in_the_log(
    k8s: DynamicClient, namespace: str, strata_crds: Any
) -> None:
    """Two writers that read the tier at one version (a peering handover, or a reconcile beside the operator):
    the later write is refused by the API server and goes again on top of the log the first one left."""
    spec = {"nodeSelector": {"strata.test/none": namespace}}
    create(k8s, namespace, {"apiVersion": API_VERSION, "kind": "KVCacheTier", "metadata": {"name": "kv"}, "spec": spec})
    read = tier_now(k8s, namespace)
    tier = TierRef.from_body(read)

    def freed(server: str, size: int) -> dict[str, Any]:
        entry = {"namespace": namespace_of(model_of(OLD)), "modelCache": "llama", "revision": OLD[:12]}
        return {**entry, "blocks": 12, "freedBytes": size, "time": f"2026-12-06T00:00:0{server}Z"}

    io.write_status(tier, {"collectedNamespaces": [freed("1", 1000)]}, read)
    io.write_status(tier, {"collectedNamespaces": [freed("2", 234)]}, read)  # read before the first write
    log = tier_now(k8s, namespace)["status"]["collectedNamespaces"]
    assert [e["freedBytes"] for e in log] == [1000, 234]

    # A third that read the log with the first entry only and freed nothing (the others' drop had freed it all)
    # writes its status with the log it read: the second entry stays.
    stale = {**read, "status": {"collectedNamespaces": [freed("1", 1000)]}}
    io.write_status(tier, {"collectedNamespaces": [freed("1", 1000)]}, stale)
    log = tier_now(k8s, namespace)["status"]["collectedNamespaces"]
    assert [e["freedBytes"] for e in log] == [1000, 234]
