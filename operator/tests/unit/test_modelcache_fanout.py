"""Fan-out of NodeLocal copies, on plain observations: the first node reads the source, the peers come up on
Ready nodes, the other nodes read from them, the source after a timeout or a failed first copy, and no peer
runs once every node is Ready."""

from __future__ import annotations

import datetime
from typing import Any

from strata_loader.contract import FetchRequest, FetchResult, VerifyMode
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.modelcache import fanout, names, storage
from strata_operator.resources.modelcache import peers as peer_objects
from strata_operator.resources.modelcache.draft import Plan
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.observed import Observed
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.plan import plan
from strata_operator.resources.runtime_image import default_runtime

from .test_modelcache_plan import ended, pod_with_result

OWNER = CacheRef(name="llama", namespace="serving", uid="cache-uid", generation=3)
NOW = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
SOURCE = "s3://models/llama"
SPEC = ModelCacheSpec.model_validate(
    {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": {"nodeSelector": {"pool": "gpu"}}}}
)
NODES = {n: NodeInfo(n, f"uid-{n}", True, {"pool": "gpu"}) for n in ("gpu-a", "gpu-b", "gpu-c")}
KEY = names.node_label_key(OWNER.namespace, OWNER.name)
SEED_MANIFEST = "sha256:" + "5e" * 32


def job(node: str, how: str) -> dict[str, Any]:
    adjust = {"origin": None, "seed": peer_objects.as_seed, "peers": peer_objects.from_peers(OWNER, SEED_MANIFEST)}[how]
    return storage.node_preload(OWNER, SPEC, node, NODES[node].uid, adjust=adjust)[1]


def request_of(body: dict[str, Any]) -> FetchRequest:
    return FetchRequest.parse_args(body["spec"]["template"]["spec"]["containers"][0]["args"])


def observe(**facts: Any) -> Observed:
    return Observed(
        owner=OWNER, previous=facts.pop("previous", {}), now=NOW, spec=SPEC, nodes=NODES, inputs_checked=True, **facts
    )


def applied(result: Plan, kind: str | None = None) -> list[dict[str, Any]]:
    return [dict(a.body) for a in result.actions if a.verb == "apply" and (kind is None or a.body["kind"] == kind)]


def ready_state(node: str, how: str) -> dict[str, Any]:
    state = {"name": node, "job": job(node, how)["metadata"]["name"], "phase": "Ready", "bytes": 10, "files": 2}
    return {**state, "manifestSha256": SEED_MANIFEST}


def live_daemonset(ready: int) -> dict[str, Any]:
    body = peer_objects.build_peer_daemonset(OWNER, SPEC, default_runtime(), paused=False)
    body["metadata"] = {**body["metadata"], "generation": 1}
    body["status"] = {"observedGeneration": 1, "numberReady": ready}
    return body


def test_the_first_node_alone_reads_the_source_and_hashes_every_file() -> None:
    result = plan(observe())
    jobs = applied(result, "Job")
    assert [j["metadata"]["name"] for j in jobs] == [job("gpu-a", "seed")["metadata"]["name"]]
    assert request_of(jobs[0]).verify is VerifyMode.CHECKSUMS and request_of(jobs[0]).peers == []
    states = {s["name"]: s for s in result.status["nodes"]}
    assert (
        states["gpu-b"]["phase"] == "Waiting"
        and "gpu-a's copy from the source comes first" in states["gpu-b"]["message"]
    )
    assert result.status["desiredNodes"] == 3 and result.status["fanOut"]["phase"] == "Seeding"
    assert result.status["phase"] == "Preloading" and not result.wake_again  # waiting is progress, not a problem
    assert applied(result, "DaemonSet") == [] and result.token_secret is None


def test_a_ready_first_copy_starts_the_peers_and_the_others_keep_waiting() -> None:
    previous = {"nodes": [ready_state("gpu-a", "seed")], "phase": "Preloading"}
    result = plan(observe(previous=previous))
    assert [b["kind"] for b in applied(result)] == ["DaemonSet", "Service", "NetworkPolicy"]
    assert result.token_secret is not None and result.token_secret.name == peer_objects.token_secret_name(OWNER)
    assert result.status["fanOut"]["waitingSince"] == "2026-01-01T00:00:00Z"
    assert {s["name"]: s["phase"] for s in result.status["nodes"]} == {
        "gpu-a": "Ready",
        "gpu-b": "Waiting",
        "gpu-c": "Waiting",
    }

    ds = applied(result, "DaemonSet")[0]
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {KEY: "Ready"}
    container = pod["containers"][0]
    assert container["args"][:2] == ["serve-peer", "/strata/node/serving/llama"]
    assert {"name": "copy", "mountPath": "/strata/node/serving/llama", "readOnly": True} in container["volumeMounts"]
    # Only this cache's directory: the node root (every namespace's copies) is not in the pod at all.
    host_paths = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert host_paths == [f"{storage.node_local(SPEC).path}/serving/llama"]
    assert container["securityContext"]["readOnlyRootFilesystem"] and pod["securityContext"]["runAsNonRoot"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert {"name": "token", "secret": {"secretName": "llama-peer-token", "defaultMode": 0o440}} in pod["volumes"]
    service = applied(result, "Service")[0]
    assert (
        service["spec"]["clusterIP"] == "None" and service["spec"]["selector"] == ds["spec"]["selector"]["matchLabels"]
    )
    policy = applied(result, "NetworkPolicy")[0]
    allowed = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
    assert allowed == {names.CACHE_LABEL: "llama", names.ROLE_LABEL: "preload"}
    assert all(b["metadata"]["ownerReferences"][0]["uid"] == "cache-uid" for b in applied(result))


def test_a_ready_peer_lets_the_other_nodes_read_from_it() -> None:
    previous = {"nodes": [ready_state("gpu-a", "seed")], "fanOut": {"phase": "Seeding", "waitingSince": "x"}}
    peers = fanout.PeerObjects(
        daemonset=live_daemonset(ready=1),
        service=peer_objects.build_peer_service(OWNER),
        network_policy=peer_objects.build_peer_network_policy(OWNER),
    )
    result = plan(observe(previous=previous, peers=peers))
    jobs = applied(result, "Job")
    assert [j["metadata"]["name"] for j in jobs] == [job(n, "peers")["metadata"]["name"] for n in ("gpu-b", "gpu-c")]
    req = request_of(jobs[0])
    assert req.peers == ["http://llama-peer.serving.svc:8477"] and req.peer_token_file == "/strata/peer/token"
    # Only peers holding the first copy's manifest, byte for byte, are used (the pod with the labels).
    assert req.peer_manifest_sha256 == SEED_MANIFEST == result.status["fanOut"]["manifestSha256"]
    mounts = jobs[0]["spec"]["template"]["spec"]["containers"][0]["volumeMounts"]
    assert {"name": "peer-token", "mountPath": "/strata/peer", "readOnly": True} in mounts
    assert result.status["fanOut"]["phase"] == "Serving" and result.status["fanOut"]["peersReady"] == 1
    assert result.status["fanOut"]["waitingSince"] is None
    assert applied(result, "DaemonSet") == [] and applied(result, "Service") == []  # live as rendered: no write


def test_no_peer_within_the_wait_sends_the_others_to_the_source() -> None:
    waited = (NOW - datetime.timedelta(seconds=901)).strftime("%Y-%m-%dT%H:%M:%SZ")
    previous = {"nodes": [ready_state("gpu-a", "seed")], "fanOut": {"phase": "Seeding", "waitingSince": waited}}
    result = plan(observe(previous=previous, peers=fanout.PeerObjects(daemonset=live_daemonset(ready=0))))
    jobs = applied(result, "Job")
    assert [j["metadata"]["name"] for j in jobs] == [job(n, "origin")["metadata"]["name"] for n in ("gpu-b", "gpu-c")]
    assert request_of(jobs[0]).peers == []
    assert result.status["fanOut"]["phase"] == "Origin" and "within 900s" in result.status["fanOut"]["message"]


def test_a_failed_first_copy_sends_the_others_to_the_source() -> None:
    seed = job("gpu-a", "seed")
    name = seed["metadata"]["name"]
    previous = {"nodes": [{"name": "gpu-a", "job": name, "phase": "Preloading"}]}
    result = plan(
        observe(
            previous={**previous},
            jobs={name: ended(seed, succeeded=False)},
            pods={name: [pod_with_result(FetchResult(status="Failed", error="403"), phase="Failed")]},
        )
    )
    assert {s["name"]: s["phase"] for s in result.status["nodes"]}["gpu-a"] == "Failed"
    # the seed's failure is seen in this plan's node states; the next plan (previous = this status) acts on it
    again = plan(observe(previous=result.status, jobs={name: ended(seed, succeeded=False)}))
    jobs = applied(again, "Job")
    assert [j["metadata"]["name"] for j in jobs] == [job(n, "origin")["metadata"]["name"] for n in ("gpu-b", "gpu-c")]
    assert again.status["fanOut"]["phase"] == "Origin"


def test_a_node_keeps_the_job_it_has_when_the_peers_go_away() -> None:
    peer_job = job("gpu-b", "peers")
    name = peer_job["metadata"]["name"]
    previous = {
        "nodes": [ready_state("gpu-a", "seed"), {"name": "gpu-b", "job": name, "phase": "Preloading"}],
        "fanOut": {"phase": "Serving"},
    }
    result = plan(observe(previous=previous, jobs={name: peer_job}))
    assert [a for a in result.actions if a.verb == "delete"] == []
    assert {s["name"]: s["phase"] for s in result.status["nodes"]} == {
        "gpu-a": "Ready",
        "gpu-b": "Preloading",
        "gpu-c": "Waiting",
    }


def test_every_node_ready_points_the_peers_at_no_node() -> None:
    previous = {"nodes": [ready_state("gpu-a", "seed"), ready_state("gpu-b", "peers"), ready_state("gpu-c", "peers")]}
    result = plan(observe(previous=previous, peers=fanout.PeerObjects(daemonset=live_daemonset(ready=3))))
    ds = applied(result)
    assert [b["kind"] for b in ds] == ["DaemonSet"]
    assert ds[0]["spec"]["template"]["spec"]["nodeSelector"] == peer_objects.PAUSED_SELECTOR
    assert result.status["phase"] == "Ready" and result.status["fanOut"]["phase"] == "Done"
    assert applied(plan(observe(previous=previous))) == []  # never started: nothing to stop


def test_fan_out_off_or_one_node_reads_the_source_everywhere() -> None:
    off = ModelCacheSpec.model_validate(
        {"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal", "nodeLocal": {"fanOut": {"enabled": False}}}}
    )
    result = plan(Observed(owner=OWNER, previous={}, now=NOW, spec=off, nodes=NODES, inputs_checked=True))
    jobs = applied(result, "Job")
    assert len(jobs) == 3 and all(request_of(j).peers == [] for j in jobs)
    assert "fanOut" not in result.status
    one = {"gpu-a": NODES["gpu-a"]}
    result = plan(Observed(owner=OWNER, previous={}, now=NOW, spec=SPEC, nodes=one, inputs_checked=True))
    assert [request_of(j).verify for j in applied(result, "Job")] == [VerifyMode.SIZES]


def test_the_fan_out_field_defaults_on_and_is_documented() -> None:
    spec = ModelCacheSpec.model_validate({"source": {"uri": SOURCE}, "storage": {"mode": "NodeLocal"}})
    assert storage.node_local(spec).fan_out.enabled and storage.node_local(spec).fan_out.peer_wait_seconds == 900


def test_a_copy_ready_in_this_plan_asks_for_another_reconcile() -> None:
    seed = job("gpu-a", "seed")
    name = seed["metadata"]["name"]
    previous = {"nodes": [{"name": "gpu-a", "job": name, "phase": "Preloading"}]}
    pods = {name: [pod_with_result(FetchResult(source=SOURCE, bytes=10, files=2))]}
    result = plan(observe(previous=previous, jobs={name: ended(seed, succeeded=True)}, pods=pods))
    assert {s["name"]: s["phase"] for s in result.status["nodes"]}["gpu-a"] == "Ready"
    assert result.wake_again  # the next plan starts from gpu-a Ready and brings the peers up
    assert [b["kind"] for b in applied(plan(observe(previous=result.status)))] == [
        "DaemonSet",
        "Service",
        "NetworkPolicy",
    ]


def test_nodes_that_start_after_the_first_copy_copy_the_commit_an_hf_branch_resolved_to() -> None:
    """A moving branch cannot give nodes different models: once the first copy recorded the commit `main` named,
    the Jobs made later ask for that commit; the Ready node keeps its Job; a changed spec revision drops the pin."""
    sha = "0123456789abcdef0123456789abcdef01234567"
    hub = ModelCacheSpec.model_validate(
        {"source": {"uri": "hf://org/model", "revision": "main"}, "storage": SPEC.storage.to_k8s()}
    )
    seed = storage.node_preload(OWNER, hub, "gpu-a", NODES["gpu-a"].uid, adjust=peer_objects.as_seed)[1]
    ready = {"name": "gpu-a", "job": seed["metadata"]["name"], "phase": "Ready", "bytes": 10, "files": 2,
             "manifestSha256": SEED_MANIFEST}  # fmt: skip
    previous = {"nodes": [ready], "resolvedRevision": sha, "resolvedFrom": "main"}
    peers = fanout.PeerObjects(daemonset=live_daemonset(ready=1), service=peer_objects.build_peer_service(OWNER))

    def later_jobs(spec: ModelCacheSpec, previous: dict[str, Any]) -> dict[str, FetchRequest]:
        result = plan(Observed(owner=OWNER, previous=previous, now=NOW, spec=spec, nodes=NODES, inputs_checked=True,
                               peers=peers))  # fmt: skip
        return {j["metadata"]["annotations"]["strata.dev/node"]: request_of(j) for j in applied(result, "Job")}

    pinned = later_jobs(hub, previous)
    assert set(pinned) == {"gpu-b", "gpu-c"}, "the Ready node's Job stays (no second copy there)"
    assert {r.revision for r in pinned.values()} == {sha} and all(r.peers for r in pinned.values())
    moved_on = later_jobs(hub.model_copy(update={"source": hub.source.model_copy(update={"revision": "v2"})}), previous)
    assert {r.revision for r in moved_on.values()} == {"v2"}, "a new spec revision is resolved afresh"
    s3 = later_jobs(SPEC, {"nodes": [ready_state("gpu-a", "seed")], "resolvedRevision": sha, "resolvedFrom": ""})
    assert {r.revision for r in s3.values()} == {None}, "an S3 revision is only a label"


def test_the_trusted_manifest_is_the_first_copys_while_a_ready_copy_has_it() -> None:
    other = "sha256:" + "0" * 64
    states = [{"name": "a", "phase": "Ready", "manifestSha256": other}, ready_state("gpu-b", "peers")]
    assert fanout.trusted_manifest({"manifestSha256": SEED_MANIFEST}, states) == SEED_MANIFEST
    assert fanout.trusted_manifest({"manifestSha256": "sha256:gone"}, states) == other  # ties: the first by name
    assert fanout.trusted_manifest({}, [{"name": "a", "phase": "Failed", "manifestSha256": other}]) is None
