"""Strata across kind's nodes, CPU only (a control plane, two workers and a spare one; e2e/kind-config.yaml): what
one node cannot show. The chart is installed as a user installs it; the origin is a real S3 server on this host,
whose own access log says which node read what (pod traffic leaves the pod network masqueraded as its node)."""

from __future__ import annotations

import pytest
from strata_testsupport.kindengines import MODELS_DIR

# The first test of the session builds the node image, starts the cluster and loads the images.
pytestmark = [pytest.mark.integration, pytest.mark.kind, pytest.mark.timeout(3600)]

MODELS_LABEL = "strata.dev/e2e-models"


def test_a_node_local_model_is_read_from_the_origin_once_and_fanned_out_to_the_other_worker(
    k8s_e2e, strata_release, kind_s3, kind_workers, hostpath_namespace, e2e
):
    """A NodeLocal ModelCache on both workers: one worker's Job reads the source, the other's copy comes from that
    worker's peer server over the pod network. The S3 server's log shows every read of the model's objects came
    from one worker's address, and a consumer on the other worker reads every tensor intact."""
    from strata_testsupport.kube import resource, wait_for
    from strata_testsupport.pods import API, model_cache, read_model_in_pod, s3_model_spec, s3_secret, upload_model

    namespace, name = hostpath_namespace, "fanout"
    assert len(kind_workers) == 2, kind_workers
    nodes = resource(k8s_e2e, "v1", "Node")
    for worker in kind_workers:
        # The node's directory, as a platform team prepares its NVMe (the field's description: it must exist).
        e2e.run("docker", "exec", worker, "install", "-d", "-o", "65532", "-g", "65532", MODELS_DIR)
        nodes.patch(name=worker, body={"metadata": {"labels": {MODELS_LABEL: "true"}}})
    bucket = kind_s3.create_bucket()
    prefix = "tiny"
    digests = upload_model(kind_s3, bucket, prefix, files=2, tensor_bytes=4 << 20)
    s3_secret(k8s_e2e, namespace, "s3", kind_s3.access_key, kind_s3.secret_key)
    spec = s3_model_spec(kind_s3, bucket, prefix, "s3")
    spec["storage"] = {"mode": "NodeLocal", "nodeLocal": {"path": MODELS_DIR, "nodeSelector": {MODELS_LABEL: "true"}}}
    model_cache(k8s_e2e, namespace, name, spec)
    caches = resource(k8s_e2e, API, "ModelCache")

    def settled() -> dict | None:
        status = caches.get(name=name, namespace=namespace).to_dict().get("status") or {}
        return status if status.get("phase") in {"Ready", "Degraded", "Failed"} else None

    status = wait_for(settled, timeout=900, interval=2, what=f"ModelCache {name} to settle")
    assert status["phase"] == "Ready", status
    assert {n["name"]: n["phase"] for n in status["nodes"]} == dict.fromkeys(kind_workers, "Ready"), status["nodes"]
    # Ready comes first; the next reconcile sees every node Ready and ends the fan-out (its peers removed).
    wait_for(
        lambda: (
            (caches.get(name=name, namespace=namespace).to_dict()["status"].get("fanOut") or {}).get("phase") == "Done"
        ),
        timeout=120,
        interval=1,
        what="the fan-out Done",
    )

    reads = [r for r in kind_s3.requests() if r.method == "GET" and r.path.startswith(f"/{bucket}/{prefix}")]
    readers = {r.client for r in reads}
    assert reads and len(readers) == 1, f"the model's objects were read by {readers}: {reads}"
    (seed,) = (node for node, address in kind_workers.items() if address in readers)
    (other,) = set(kind_workers) - {seed}
    print(f"origin reads: {len(reads)} GETs, all from {seed}; {other}'s copy came from its peer")

    snippet = status["volume"]
    on_other = {"nodeSelector": {**snippet["nodeSelector"], "kubernetes.io/hostname": other}}
    assert read_model_in_pod(k8s_e2e, namespace, "consumer", snippet, image=e2e.runtime_image, **on_other) == digests

    caches.delete(name=name, namespace=namespace)
    wait_for(lambda: not caches.get(namespace=namespace).items, timeout=300, interval=2, what="the cache deleted")
    for worker in kind_workers:
        left = e2e.run("docker", "exec", worker, "sh", "-c", f"ls -A {MODELS_DIR}/{namespace} 2>/dev/null || true")
        assert name not in left.split(), f"{worker} still holds the copy: {left}"


def test_kv_written_on_one_worker_is_read_on_the_other_through_the_shared_l2_never_the_other_server(
    k8s_e2e, strata_release, kind_s3, kind_workers, e2e
):
    """A KVCacheTier with an S3 L2 runs a server on each worker. A client on one worker writes chunks through the
    node-local Service (its own node's server, which writes them behind to the bucket); a client on the other
    worker reads every chunk back through its own node's server, which has them only from the bucket. The S3
    server's log shows it: each object the reader's server fetched was written by the writer's node, and fetched
    from the reader's node's address, so the reader never reached the writer's server and its memory."""
    from strata_testsupport.kindengines import fetched_only_from_the_writer, s3_tier, wait_servers_ready, written_behind
    from strata_testsupport.pods import kv_client_pod, s3_secret
    from strata_testsupport.realnode import pod_security_namespace

    writer, reader = sorted(kind_workers)
    tier, count = "shared-kv", 24
    namespaces = pod_security_namespace(k8s_e2e, "restricted")
    namespace = next(namespaces)
    try:
        s3_secret(k8s_e2e, namespace, "s3", kind_s3.access_key, kind_s3.secret_key)
        bucket, prefix = s3_tier(k8s_e2e, kind_s3, namespace, tier)
        wait_servers_ready(k8s_e2e, namespace, tier, kind_workers)
        on = {
            node: {"image": e2e.runtime_image, "nodeSelector": {"kubernetes.io/hostname": node}}
            for node in kind_workers
        }
        kv_client_pod(k8s_e2e, namespace, tier, "writer", "write", count, **on[writer])
        written_behind(kind_s3, bucket, prefix, count)
        read = kv_client_pod(k8s_e2e, namespace, tier, "reader", "read", count, **on[reader])
        assert all(read[f"chunk-{i:04d}"] for i in range(count)), read

        addresses = kind_workers[writer], kind_workers[reader]
        print(fetched_only_from_the_writer(kind_s3, bucket, prefix, *addresses, at_least=count))
    finally:
        next(namespaces, None)  # deletes the namespace


def test_a_node_that_joins_the_cluster_gets_the_model_from_a_peer_and_the_kv_the_others_wrote(
    k8s_e2e, strata_release, kind_s3, kind_workers, spare_worker, hostpath_namespace, e2e
):
    """A node pool of one worker serves: a NodeLocal ModelCache Ready there, a KVCacheTier with an S3 L2 holding
    chunks a client on that worker wrote. Then a new machine joins the running cluster (the spare worker's
    `kubeadm join`), carrying the pool's label from its kubelet as a pool's new node does. Its copy of the model
    turns Ready with no read of the origin at all (it came from the first worker's peer), a consumer there reads
    every tensor, the tier starts a server on it, and a client there reads every chunk the first worker wrote, which
    its own server fetched from the bucket."""
    from strata_testsupport.kindengines import s3_tier, wait_servers_ready, written_behind
    from strata_testsupport.kube import delete_quietly, resource, wait_for
    from strata_testsupport.pods import (
        API,
        kv_client_pod,
        model_cache,
        read_model_in_pod,
        s3_model_spec,
        s3_secret,
        upload_model,
    )

    namespace, name, tier, count = hostpath_namespace, "joiner", "pool-kv", 16
    pool = {"strata.dev/e2e-pool": "serving"}  # the spare worker's kubelet registers with it (e2e/kind-config.yaml)
    first, joiner = sorted(kind_workers)[0], spare_worker.name
    nodes, caches = resource(k8s_e2e, "v1", "Node"), resource(k8s_e2e, API, "ModelCache")
    for machine in (first, joiner):
        e2e.run("docker", "exec", machine, "install", "-d", "-o", "65532", "-g", "65532", MODELS_DIR)
    nodes.patch(name=first, body={"metadata": {"labels": pool}})
    on = lambda node: {"image": e2e.runtime_image, "nodeSelector": {"kubernetes.io/hostname": node}}  # noqa: E731
    try:
        bucket, prefix = kind_s3.create_bucket(), "tiny"
        digests = upload_model(kind_s3, bucket, prefix, files=2, tensor_bytes=4 << 20)
        s3_secret(k8s_e2e, namespace, "s3", kind_s3.access_key, kind_s3.secret_key)
        kv_bucket, kv_prefix = s3_tier(k8s_e2e, kind_s3, namespace, tier)
        spec = s3_model_spec(kind_s3, bucket, prefix, "s3")
        spec["storage"] = {"mode": "NodeLocal", "nodeLocal": {"path": MODELS_DIR, "nodeSelector": pool}}
        model_cache(k8s_e2e, namespace, name, spec)

        def node_phases() -> dict[str, str]:
            status = caches.get(name=name, namespace=namespace).to_dict().get("status") or {}
            return {n["name"]: n["phase"] for n in status.get("nodes") or []}

        wait_for(lambda: node_phases() == {first: "Ready"}, timeout=600, interval=2, what=f"{name} Ready on {first}")
        origin_reads = [r for r in kind_s3.requests() if r.method == "GET" and r.path.startswith(f"/{bucket}/{prefix}")]
        assert {r.client for r in origin_reads} == {kind_workers[first]}, origin_reads
        wait_servers_ready(k8s_e2e, namespace, tier, kind_workers)
        kv_client_pod(k8s_e2e, namespace, tier, "writer", "write", count, **on(first))
        written_behind(kind_s3, kv_bucket, kv_prefix, count)

        # -- a machine joins the cluster ------------------------------------------------------------------------
        joined_from = spare_worker.join()
        print(f"{joiner} joined the cluster as {joined_from}")
        wait_for(
            lambda: node_phases() == {first: "Ready", joiner: "Ready"},
            timeout=600,
            interval=2,
            what=f"{joiner}'s copy of {name} Ready",
        )
        later = [r for r in kind_s3.requests() if r.method == "GET" and r.path.startswith(f"/{bucket}/{prefix}")]
        assert later == origin_reads, f"the origin was read again after {joiner} joined: {later[len(origin_reads) :]}"
        snippet = caches.get(name=name, namespace=namespace).to_dict()["status"]["volume"]
        on_joiner = {"nodeSelector": {**snippet["nodeSelector"], "kubernetes.io/hostname": joiner}}
        assert (
            read_model_in_pod(k8s_e2e, namespace, "newcomer", snippet, image=e2e.runtime_image, **on_joiner) == digests
        )

        wait_servers_ready(k8s_e2e, namespace, tier, {joiner})
        read = kv_client_pod(k8s_e2e, namespace, tier, "reader", "read", count, **on(joiner))
        assert all(read[f"chunk-{i:04d}"] for i in range(count)), read
        fetchers = {
            r.client
            for r in kind_s3.requests()
            if r.method == "GET" and r.status in (200, 206) and r.path.startswith(f"/{kv_bucket}/{kv_prefix}")
        }
        assert fetchers == {joined_from}, f"the chunks were fetched from {fetchers}, not by {joiner}'s server"
    finally:
        delete_quietly(k8s_e2e, API, "ModelCache", name, namespace)
        wait_for(lambda: not caches.get(namespace=namespace).items, timeout=300, interval=2, what="the cache deleted")
        delete_quietly(k8s_e2e, API, "KVCacheTier", tier, namespace)
        nodes.patch(name=first, body={"metadata": {"labels": dict.fromkeys(pool)}})
        if spare_worker.node() is not None:
            spare_worker.leave()


def test_a_node_that_stops_answering_mid_preload_and_mid_serving_is_named_kept_and_resumed(
    k8s_e2e, strata_release, kind_s3, kind_workers, hostpath_namespace, e2e
):
    """A worker stops answering (its node container frozen with `docker pause`: the kubelet stops posting status,
    as a hung or partitioned node does), first while both workers copy a NodeLocal model, then while pods use it.

    Mid-preload: the origin is reached through a gate that holds both workers' copies partway (so the stop lands
    mid-copy on any machine, however fast); the stopped worker's state turns NodeNotReady naming it and why, its
    Job is kept, the other worker's copy completes and the cache is usable there; when the worker returns its copy
    resumes and the cache is Ready on both. Mid-serving: the ModelCache names the node, a
    consumer Deployment's pod moves to the worker whose copy is Ready, and when the worker returns its copy is Ready
    again with no read of the origin; nothing is left behind once the cache is deleted."""
    from strata_testsupport.counting_proxy import CountingProxy
    from strata_testsupport.kube import resource, wait_for
    from strata_testsupport.pods import API, kv_token_secret, model_cache, s3_model_spec, s3_secret, upload_model

    namespace, name, label = hostpath_namespace, "survivor", "strata.dev/e2e-loss"
    nodes, caches = resource(k8s_e2e, "v1", "Node"), resource(k8s_e2e, API, "ModelCache")
    jobs, pods = resource(k8s_e2e, "batch/v1", "Job"), resource(k8s_e2e, "v1", "Pod")
    # The worker that stops is one the operator does not run on (in a cluster it runs on system nodes; here a
    # frozen operator would say nothing about anything).
    operator_nodes = {
        p["spec"].get("nodeName")
        for p in pods.get(namespace="strata-system").to_dict()["items"]
        if any(o.get("kind") == "ReplicaSet" for o in p["metadata"].get("ownerReferences") or [])
    }
    lost = sorted(set(kind_workers) - operator_nodes)[0]
    (stable,) = set(kind_workers) - {lost}
    for worker in kind_workers:
        e2e.run("docker", "exec", worker, "install", "-d", "-o", "65532", "-g", "65532", MODELS_DIR)
        nodes.patch(name=worker, body={"metadata": {"labels": {label: "true"}}})
    bucket, prefix = kind_s3.create_bucket(), "tiny"
    upload_model(kind_s3, bucket, prefix, files=2, tensor_bytes=4 << 20)
    s3_secret(k8s_e2e, namespace, "s3", kind_s3.access_key, kind_s3.secret_key)
    host, port = kind_s3.endpoint_url.removeprefix("http://").rsplit(":", 1)
    gate = CountingProxy(int(port), host, hold_ranges_after=1, listen_host=host)
    spec = s3_model_spec(kind_s3, bucket, prefix, "s3")
    spec["source"]["s3"]["endpoint"] = gate.endpoint_url
    spec["storage"] = {
        "mode": "NodeLocal",
        "nodeLocal": {"path": MODELS_DIR, "nodeSelector": {label: "true"}, "fanOut": {"enabled": False}},
    }

    def status() -> dict:
        return caches.get(name=name, namespace=namespace).to_dict().get("status") or {}

    def node_states() -> dict[str, dict]:
        return {n["name"]: n for n in status().get("nodes") or []}

    def cache_events() -> list[tuple[str, str, str]]:
        listed = resource(k8s_e2e, "v1", "Event").get(
            namespace=namespace, field_selector=f"involvedObject.kind=ModelCache,involvedObject.name={name}"
        )
        return [(e.type, e.reason, e.message) for e in listed.items]

    tiers, tier_seen = resource(k8s_e2e, API, "KVCacheTier"), []

    def tier_status() -> dict:
        return tiers.get(name="kv", namespace=namespace).to_dict().get("status") or {}

    def tier_instances(reason: str) -> dict | None:
        """The tier's AllInstancesReady condition when its reason is `reason` (each one seen is kept, so a
        timeout shows what the tier said instead)."""
        found = next((c for c in tier_status().get("conditions") or [] if c["type"] == "AllInstancesReady"), None)
        tier_seen.append(found)
        return found if found and found["reason"] == reason else None

    def wait_tier(reason: str, what: str) -> dict:
        try:
            return wait_for(lambda: tier_instances(reason), timeout=300, interval=2, what=what)
        except AssertionError as timed_out:
            seen = [dict(c or {}) for c in tier_seen[-3:]]
            raise AssertionError(
                f"{timed_out}; the tier said {seen}; status {tier_status()}; {tier_servers_seen()}"
            ) from None

    def tier_servers_seen() -> str:
        """What the tier's controller reads, as the API server has it, and what the operator logged about it."""
        servers = pods.get(namespace=namespace, label_selector="app.kubernetes.io/name=strata-kv").to_dict()["items"]
        ready = {
            p["metadata"]["name"]: [
                (c["type"], c["status"], c.get("reason")) for c in p["status"].get("conditions") or []
            ]
            for p in servers
        }
        operator = [
            p["metadata"]["name"]
            for p in pods.get(namespace="strata-system").to_dict()["items"]
            if any(o.get("kind") == "ReplicaSet" for o in p["metadata"].get("ownerReferences") or [])
        ]
        from kubernetes.client import CoreV1Api

        core = CoreV1Api(k8s_e2e.client)
        logs = {name: core.read_namespaced_pod_log(name, "strata-system", tail_lines=40) for name in operator}
        return f"servers' conditions {ready}; operator log {logs}"

    def not_ready(node: str) -> dict | None:
        state = node_states().get(node) or {}
        return state if state.get("phase") == "NodeNotReady" else None

    paused = False
    try:
        model_cache(k8s_e2e, namespace, name, spec)
        # Mid-preload: both workers' copies held at the gate, then one worker stops answering.
        wait_for(lambda: gate.held_from >= set(kind_workers.values()), timeout=300, interval=1, what="both copies held")
        job_of_lost = node_states()[lost]["job"]
        e2e.run("docker", "pause", lost)
        paused = True
        gate.release()
        state = wait_for(lambda: not_ready(lost), timeout=300, interval=2, what=f"{lost} NodeNotReady in status")
        assert "Kubelet stopped posting node status" in state["message"], state
        assert state["beforeNodeLoss"]["phase"] == "Preloading" and state["job"] == job_of_lost, state
        wait_for(lambda: status().get("readyNodes") == 1, timeout=300, interval=2, what=f"{stable}'s copy Ready")
        during = status()
        ready = next(c for c in during["conditions"] if c["type"] == "Ready")
        degraded = next(c for c in during["conditions"] if c["type"] == "Degraded")
        assert ready["status"] == "True" and during["phase"] == "Degraded", during
        assert degraded["reason"] == "NodeNotReady" and lost in degraded["message"], degraded
        assert jobs.get(name=job_of_lost, namespace=namespace), "the stopped worker's Job was deleted"
        # Events are posted apart from the status write: wait for the Warning rather than expect it already there.
        wait_for(
            lambda: any(
                (t, r) == ("Warning", "NodeNotReady") and m.startswith(f"node {lost}: ") for t, r, m in cache_events()
            ),
            timeout=120,
            interval=2,
            what=f"a Warning NodeNotReady Event naming {lost}",
        )

        e2e.run("docker", "unpause", lost)
        paused = False
        wait_for(lambda: status().get("readyNodes") == 2, timeout=600, interval=2, what=f"{lost}'s copy resumed")
        assert status()["phase"] == "Ready" and node_states()[lost]["job"] == job_of_lost, status()
        wait_for(
            lambda: ("Normal", "NodeReturned") in [e[:2] for e in cache_events()],
            timeout=120,
            interval=2,
            what="a NodeReturned Event",
        )
        reads_before_serving = gate.gets

        # Mid-serving: a KV tier's server on each worker, and a consumer on the worker that will stop.
        kv_token_secret(k8s_e2e, namespace)
        tier_spec = {
            "l1": {"size": "64Mi"},
            "auth": {"secretRef": {"name": "kv-token", "key": "token"}},
            "resources": {"requests": {"cpu": "50m"}},
        }
        tiers.create(
            namespace=namespace,
            body={"apiVersion": API, "kind": "KVCacheTier", "metadata": {"name": "kv"}, "spec": tier_spec},
        )
        wait_tier("AllReady", "the tier's servers ready")
        deployments = resource(k8s_e2e, "apps/v1", "Deployment")
        deployments.create(namespace=namespace, body=consumer_deployment(status()["volume"], lost, e2e.runtime_image))

        def consumer_nodes() -> dict[str, str]:
            listed = pods.get(namespace=namespace, label_selector="app=consumer").to_dict()["items"]
            running = [
                p
                for p in listed
                if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
            ]
            return {p["metadata"]["name"]: p["spec"]["nodeName"] for p in running}

        wait_for(
            lambda: list(consumer_nodes().values()) == [lost], timeout=300, interval=2, what="a consumer on " + lost
        )

        e2e.run("docker", "pause", lost)
        paused = True
        state = wait_for(lambda: not_ready(lost), timeout=300, interval=2, what=f"{lost} NodeNotReady while serving")
        assert state["beforeNodeLoss"]["phase"] == "Ready", state
        # The tier names the worker whose server its clients there can no longer reach, and why.
        instances = wait_tier("NodeNotReady", f"the tier naming {lost}")
        # Names followed by ": ": one worker's name may begin another's (strata-e2e-worker, strata-e2e-worker2).
        assert f"{lost}: " in instances["message"] and f"{stable}: " not in instances["message"], instances
        endpoints = {e["node"]: e for e in tier_status()["endpoints"]}
        assert "Kubelet stopped posting node status" in endpoints[lost]["nodeNotReady"], endpoints
        assert endpoints[stable]["ready"] and "nodeNotReady" not in endpoints[stable], endpoints
        tier_events = resource(k8s_e2e, "v1", "Event").get(
            namespace=namespace, field_selector="involvedObject.kind=KVCacheTier,involvedObject.name=kv"
        )
        assert any(e.type == "Warning" and e.reason == "NodeNotReady" for e in tier_events.items), [
            (e.type, e.reason, e.message) for e in tier_events.items
        ]
        # The taint evicts the pod there; its replacement runs where the model is Ready.
        wait_for(
            lambda: list(consumer_nodes().values()) == [stable], timeout=300, interval=2, what="the consumer moved"
        )

        e2e.run("docker", "unpause", lost)
        paused = False
        wait_for(
            lambda: status().get("phase") == "Ready" and status().get("readyNodes") == 2,
            timeout=300,
            interval=2,
            what="the cache recovered",
        )
        assert gate.gets == reads_before_serving, "the returning worker's kept copy was read from the origin again"
        wait_tier("AllReady", "the tier's servers ready again")
        deployments.delete(name="consumer", namespace=namespace)
        tiers.delete(name="kv", namespace=namespace)
    finally:
        if paused:
            e2e.run("docker", "unpause", lost)
        gate.close()
        caches.delete(name=name, namespace=namespace)
        wait_for(lambda: not caches.get(namespace=namespace).items, timeout=300, interval=2, what="the cache deleted")
        for worker in kind_workers:
            nodes.patch(name=worker, body={"metadata": {"labels": {label: None}}})
    # Nothing orphaned: no Job, no preload pod, no copy on either worker.
    wait_for(lambda: not jobs.get(namespace=namespace).items, timeout=300, interval=2, what="no Job of the cache left")
    wait_for(
        lambda: not pods.get(namespace=namespace, label_selector="app.kubernetes.io/managed-by=strata").items,
        timeout=300,
        interval=2,
        what="no pod of the cache left",
    )
    for worker in kind_workers:
        left = e2e.run("docker", "exec", worker, "sh", "-c", f"ls -A {MODELS_DIR}/{namespace} 2>/dev/null || true")
        assert name not in left.split(), f"{worker} still holds the copy: {left}"


def consumer_deployment(snippet: dict, prefer: str, image: str) -> dict:
    """One replica that mounts the cache (its `status.volume`), placed on `prefer` while it can be, and evicted
    5 s after its node stops answering (instead of the default 300 s), as serving Deployments often set."""
    volume, mount = snippet["volume"], snippet["volumeMount"]
    gone = [
        {"key": f"node.kubernetes.io/{t}", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 5}
        for t in ("unreachable", "not-ready")
    ]
    preferred = {
        "weight": 100,
        "preference": {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [prefer]}]},
    }
    pod = {
        "nodeSelector": snippet["nodeSelector"],
        "affinity": {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [preferred]}},
        "tolerations": gone,
        "terminationGracePeriodSeconds": 1,
        "containers": [
            {
                "name": "consumer",
                "image": image,
                "imagePullPolicy": "IfNotPresent",
                "command": ["sleep", "infinity"],
                "volumeMounts": [mount],
            }
        ],
        "volumes": [volume],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "consumer"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "consumer"}},
            "template": {"metadata": {"labels": {"app": "consumer"}}, "spec": pod},
        },
    }
