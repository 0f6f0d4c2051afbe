"""NodeLocal fan-out against the real API server: one Job reads the source first; once its copy is Ready the
peer DaemonSet (its pods run by kwok on the node with the copy), headless Service, NetworkPolicy and token
Secret appear; the other nodes' Jobs start only when a peer pod is ready, and read from the peers' Service;
with every node Ready the DaemonSet runs on no node. Jobs' results are reported as in the other NodeLocal
tests (see test_modelcache_support); everything else (DaemonSet controller, scheduler, kwok's pod readiness,
garbage collection) is the real thing."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from strata_loader.contract import FetchRequest, VerifyMode
from strata_testsupport.kube import get_or_none, resource, wait_for

from .test_kvcachetier import require_kwok
from .test_modelcache_support import (
    Heartbeat,
    cache_jobs,
    create_cache,
    fetch_result,
    finish_job,
    get_cache,
    unique,
    wait_for_status,
)

pytestmark = pytest.mark.integration
SOURCE = "s3://models/llama"


def request_of(job: dict[str, Any]) -> FetchRequest:
    return FetchRequest.parse_args(job["spec"]["template"]["spec"]["containers"][0]["args"])


def jobs_by_node(k8s: DynamicClient, namespace: str, name: str) -> dict[str, dict[str, Any]]:
    """The cache's preload Job per node; never two for one node (a copy is never restarted another way)."""
    jobs = cache_jobs(k8s, namespace, name)
    found = {j["metadata"]["annotations"]["strata.dev/node"]: j for j in jobs}
    seen = [(j["metadata"]["annotations"]["strata.dev/node"], j["metadata"]["name"], request_of(j).peers,
             j["metadata"].get("deletionTimestamp")) for j in jobs]  # fmt: skip
    assert len(found) == len(jobs), f"more than one Job for a node: {seen}"
    return found


def pool_of_three(nodes: Heartbeat) -> tuple[dict[str, str], list[str]]:
    pool = {"strata-test/pool": unique("pool")}
    return pool, [nodes.add(unique(prefix), pool) for prefix in ("gpu-a", "gpu-b", "gpu-c")]


def test_the_source_is_read_once_and_the_other_nodes_read_from_peers(
    k8s: DynamicClient, operator: Any, control_plane: Any, namespace: str, nodes: Heartbeat
) -> None:
    require_kwok(control_plane)
    pool, (a, b, c) = pool_of_three(nodes)
    name = unique("mc")
    create_cache(
        k8s,
        namespace,
        name,
        {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": {"nodeSelector": pool}}},
    )

    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 3, "three selected nodes")
    assert status["fanOut"]["phase"] == "Seeding"
    jobs = jobs_by_node(k8s, namespace, name)
    assert list(jobs) == [a]  # only the first node reads the source ...
    seed = request_of(jobs[a])
    assert seed.verify is VerifyMode.CHECKSUMS and seed.peers == []  # ... and hashes every file for the peers
    states = {n["name"]: n for n in status["nodes"]}
    assert states[b]["phase"] == states[c]["phase"] == "Waiting" and "comes first" in states[b]["message"]
    peer = f"{name}-peer"
    assert get_or_none(k8s, "apps/v1", "DaemonSet", peer, namespace) is None

    finish_job(k8s, namespace, jobs[a]["metadata"]["name"], fetch_result(SOURCE))
    status = wait_for_status(
        k8s, namespace, name, lambda s: (s.get("fanOut") or {}).get("phase") == "Serving", "a ready peer", timeout=90
    )
    key = status["nodeLabel"]
    ds = resource(k8s, "apps/v1", "DaemonSet").get(name=peer, namespace=namespace).to_dict()
    pod_spec = ds["spec"]["template"]["spec"]
    assert pod_spec["nodeSelector"] == {key: "Ready"}
    assert pod_spec["containers"][0]["args"][0] == "serve-peer"
    assert all(m.get("readOnly") for m in pod_spec["containers"][0]["volumeMounts"])
    peer_pods = resource(k8s, "v1", "Pod").get(
        namespace=namespace, label_selector=f"strata.dev/modelcache={name},strata.dev/role=peer"
    )
    assert [p.spec.nodeName for p in peer_pods.items] == [a]  # only where the copy is
    service = resource(k8s, "v1", "Service").get(name=peer, namespace=namespace)
    assert service.spec.clusterIP == "None"
    policy = resource(k8s, "networking.k8s.io/v1", "NetworkPolicy").get(name=peer, namespace=namespace)
    assert policy.spec.ingress[0]["from"][0]["podSelector"]["matchLabels"]["strata.dev/role"] == "preload"
    secret = resource(k8s, "v1", "Secret").get(name=f"{name}-peer-token", namespace=namespace)
    assert secret.immutable and len(base64.b64decode(secret.data["token"])) >= 32
    assert secret.metadata.ownerReferences[0].name == name

    jobs = wait_for(lambda: (j := jobs_by_node(k8s, namespace, name)) and len(j) == 3 and j, what="the peers' Jobs")
    for node in (b, c):
        req = request_of(jobs[node])
        assert req.peers, f"node {node} reads the source: {get_cache(k8s, namespace, name)['status']}"
        assert req.peers == [f"http://{peer}.{namespace}.svc:8477"] and req.peer_token_file == "/strata/peer/token"
        volumes = jobs[node]["spec"]["template"]["spec"]["volumes"]
        assert {"name": "peer-token", "secret": {"secretName": f"{name}-peer-token", "defaultMode": 0o440}} in volumes
        finish_job(k8s, namespace, jobs[node]["metadata"]["name"], fetch_result(SOURCE, bytes_from_peers=5 * 2**30))

    status = wait_for_status(k8s, namespace, name, lambda s: s.get("readyNodes") == 3, "all three copies")
    assert status["phase"] == "Ready"
    status = wait_for_status(k8s, namespace, name, lambda s: s["fanOut"]["phase"] == "Done", "fan-out done")

    def peer_selector() -> Any:
        ds = resource(k8s, "apps/v1", "DaemonSet").get(name=peer, namespace=namespace).to_dict()
        return ds["spec"]["template"]["spec"]["nodeSelector"]

    wait_for(lambda: peer_selector() == {"strata.dev/fan-out": "done"}, what="the peers pointed at no node")
    wait_for(
        lambda: (
            not [
                p
                for p in resource(k8s, "v1", "Pod")
                .get(namespace=namespace, label_selector="strata.dev/role=peer")
                .items
                if not p.metadata.deletionTimestamp
            ]
        ),
        timeout=60,
        what="no peer pod left",
    )
    assert len(cache_jobs(k8s, namespace, name)) == 3  # nothing restarted on the way


def test_without_a_ready_peer_in_time_the_others_read_the_source(
    k8s: DynamicClient, operator: Any, namespace: str, nodes: Heartbeat
) -> None:
    pool, (a, b, c) = pool_of_three(nodes)
    name = unique("mc")
    local = {"nodeSelector": pool, "fanOut": {"peerWaitSeconds": 0}}
    create_cache(
        k8s, namespace, name, {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": local}}
    )
    wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 3, "three selected nodes")
    jobs = jobs_by_node(k8s, namespace, name)
    assert list(jobs) == [a]
    finish_job(k8s, namespace, jobs[a]["metadata"]["name"], fetch_result(SOURCE))
    with_jobs = lambda s: sum(1 for n in s.get("nodes") or [] if n.get("job")) == 3  # noqa: E731
    wait_for_status(k8s, namespace, name, with_jobs, "a Job for every node")
    jobs = wait_for(lambda: (j := jobs_by_node(k8s, namespace, name)) and len(j) == 3 and j, what="the others' Jobs")
    assert request_of(jobs[b]).peers == [] and request_of(jobs[c]).peers == []
    status = wait_for_status(k8s, namespace, name, lambda s: s["fanOut"]["phase"] == "Origin", "phase Origin")
    assert "no peer was ready within 0s" in status["fanOut"]["message"]


def test_fan_out_off_starts_every_node_from_the_source_at_once(
    k8s: DynamicClient, operator: Any, namespace: str, nodes: Heartbeat
) -> None:
    pool, three = pool_of_three(nodes)
    name = unique("mc")
    local = {"nodeSelector": pool, "fanOut": {"enabled": False}}
    create_cache(
        k8s, namespace, name, {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": local}}
    )
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("desiredNodes") == 3, "three selected nodes")
    jobs = wait_for(lambda: (j := jobs_by_node(k8s, namespace, name)) and len(j) == 3 and j, what="three Jobs")
    assert sorted(jobs) == sorted(three) and all(request_of(j).peers == [] for j in jobs.values())
    assert "fanOut" not in status
    assert get_or_none(k8s, "apps/v1", "DaemonSet", f"{name}-peer", namespace) is None
