"""ModelCache controller cost at scale, on the real local control plane: 200 caches across 50 fake nodes.

Measures, in one run, with the operator as its own process (`strata-operator run`):
- create → children: from the create call returning to the last child of that cache existing (SharedPVC: claim
  and preloader Job; NodeLocal: one pinned Job per node of its pool), median / p90 / max over all caches;
- create → status: until the cache's status names its Jobs (the operator has reported back);
- completion → Ready: the preloader pods are reported finished with a real FetchResult (as the kubelet would),
  until every cache is Ready (NodeLocal: every node labelled);
- the operator's CPU seconds, peak RSS and API requests (by verb and resource, counted inside the operator's
  process for both of its clients: kopf's aiohttp and the kubernetes client) per phase, including an idle
  phase where nothing changes (what the resync and the watches cost at rest).

Nodes are fake and kept Ready by this script (not kwok: kwok would complete the pods without a termination
message). Usage: python bench/operator_modelcache.py [--caches 200] [--nodes 50] [--pool-size 5] [--idle 30]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testsupport"))

NAMESPACE = "bench"
CACHE_LABEL = "strata.dev/modelcache"
COUNTS_ENV = "STRATA_BENCH_COUNTS"


# -- the operator side: count every API request, then run the operator ---------------------------------------
def request_key(method: str, url: str, watch: bool = False) -> str:
    """`VERB resource[/subresource]` from a Kubernetes API URL: list and get apart, watches on their own."""
    path, _, query = url.partition("?")
    parts = [p for p in path.split("/") if p]
    if "/api/" in path or path.endswith("/api"):
        parts = parts[parts.index("api") + 2 :]
    elif "apis" in parts:
        parts = parts[parts.index("apis") + 3 :]
    if len(parts) >= 3 and parts[0] == "namespaces":
        parts = parts[2:]
    resource = parts[0] if parts else "discovery"
    named = len(parts) >= 2
    if len(parts) >= 3:
        resource += "/" + parts[2]
    verb = method.upper()
    if verb == "GET":
        verb = "WATCH" if watch or "watch=true" in query else ("GET" if named else "LIST")
    return f"{verb} {resource}"


def run_counted_operator() -> None:
    """Entry point of the operator child: wrap both HTTP clients, dump counts to a file every 0.5 s."""
    import aiohttp
    import kubernetes.client.rest

    counts: collections.Counter[str] = collections.Counter()
    lock = threading.Lock()

    def key(method: str, url: str, watch: bool = False) -> str:
        return request_key(method, str(url), watch)

    original_request = kubernetes.client.rest.RESTClientObject.request

    def counted_request(self: Any, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        with lock:
            counts[key(method, url)] += 1
        return original_request(self, method, url, *args, **kwargs)

    kubernetes.client.rest.RESTClientObject.request = counted_request

    original_aio = aiohttp.ClientSession._request

    async def counted_aio(self: Any, method: str, url: Any, *args: Any, **kwargs: Any) -> Any:
        params = kwargs.get("params") or {}
        with lock:
            counts[key(method, str(url), watch=str(params.get("watch", "")).lower() == "true")] += 1
        return await original_aio(self, method, url, *args, **kwargs)

    aiohttp.ClientSession._request = counted_aio  # type: ignore[method-assign,assignment]
    count_wakeups(counts, lock)
    target = Path(os.environ[COUNTS_ENV])

    def dump() -> None:
        while True:
            with lock:
                text = json.dumps(dict(counts))
            target.with_suffix(".tmp").write_text(text)
            target.with_suffix(".tmp").replace(target)
            time.sleep(0.5)

    threading.Thread(target=dump, daemon=True).start()
    from strata_operator.cli import main

    main(["run", "--liveness=http://127.0.0.1:0/healthz"])


def count_wakeups(counts: collections.Counter[str], lock: threading.Lock) -> None:
    """Also count what woke the reconcile loops: node changes that matter, and child or spec events. The
    controller's memory is made at startup, so the counting wraps the methods of its classes."""
    from strata_operator.handlers.modelcache import events as modelcache
    from strata_operator.handlers.modelcache import node_cache as modelcache_nodes

    observe = modelcache_nodes.NodeCache.observe
    wake = modelcache.ModelCacheMemory.wake

    def counted_observe(self: Any, body: Any, *, deleted: bool = False) -> Any:
        before = self._nodes.get(body["metadata"]["name"])
        changed = observe(self, body, deleted=deleted)
        if sys._getframe(1).f_code.co_name == "node_changed":  # the watch, not our own label write
            after = self._nodes.get(body["metadata"]["name"])
            what = "readiness" if before and after and before.ready != after.ready else "labels/uid"
            with lock:
                if changed.placement:
                    counts[f"wakeup: node change ({what}), all node-using caches"] += 1
                elif changed.model_labels:
                    counts["wakeup: model label change, its cache"] += 1
                else:
                    counts["node event ignored"] += 1
        return changed

    def counted_wake(self: Any, namespace: str | None, name: str | None) -> None:
        caller = sys._getframe(1).f_code.co_name  # which watch handler: modelcache_changed, child_changed, ...
        with lock:
            counts[f"wakeup: {caller}"] += 1
        wake(self, namespace, name)

    modelcache_nodes.NodeCache.observe = counted_observe  # type: ignore[method-assign]
    modelcache.ModelCacheMemory.wake = counted_wake  # type: ignore[method-assign]


# -- the bench side --------------------------------------------------------------------------------------------
class Heartbeat:
    """Keeps the fake nodes Ready (a kubelet's job); without it the node lifecycle controller marks them NotReady."""

    def __init__(self, client: Any, names: list[str]) -> None:
        self.client, self.names, self.stop = client, names, threading.Event()
        self.beat()
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def beat(self) -> None:
        from strata_testsupport.kube import resource

        now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench heartbeat"}
        body = {"status": {"conditions": [{**ready, "lastHeartbeatTime": now, "lastTransitionTime": now}]}}
        nodes = resource(self.client, "v1", "Node")
        for name in self.names:
            nodes.status.patch(name=name, body=body, content_type="application/strategic-merge-patch+json")

    def run(self) -> None:
        while not self.stop.wait(10):
            self.beat()


def cache_spec(index: int, pool_count: int) -> dict[str, Any]:
    if index % 2 == 0:
        storage = {"mode": "SharedPVC", "sharedPVC": {"size": "50Gi"}}
    else:
        # Fan-out off: this measures one pinned Job per node of the pool, created at once.
        local = {"nodeSelector": {"bench/pool": str(index % pool_count)}, "fanOut": {"enabled": False}}
        storage = {"mode": "NodeLocal", "nodeLocal": local}
    return {"source": {"uri": f"s3://bench-models/model-{index}"}, "storage": storage}


class ChildClock:
    """Watches Jobs and claims of every cache and records when each cache's child set became complete."""

    def __init__(self, client: Any, expected: dict[str, int]) -> None:
        self.client, self.expected = client, expected
        self.seen: dict[str, set[str]] = collections.defaultdict(set)
        self.complete_at: dict[str, float] = {}
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self.watch, args=(kind,), daemon=True) for kind in ("Job", "PVC")]
        for thread in self.threads:
            thread.start()

    def watch(self, kind: str) -> None:
        from strata_testsupport.kube import resource

        api = resource(self.client, *(("batch/v1", "Job") if kind == "Job" else ("v1", "PersistentVolumeClaim")))
        try:
            for event in api.watch(namespace=NAMESPACE, label_selector=CACHE_LABEL, timeout=3600):
                self.record(kind, event["object"])
        except Exception:  # the control plane going away at the end of the run
            return

    def record(self, kind: str, obj: Any) -> None:
        cache = obj.metadata.labels[CACHE_LABEL]
        with self.lock:
            self.seen[cache].add(f"{kind}/{obj.metadata.name}")
            if len(self.seen[cache]) >= self.expected.get(cache, 1 << 30) and cache not in self.complete_at:
                self.complete_at[cache] = time.monotonic()


def summary(samples: list[float]) -> str:
    ordered = sorted(samples)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    return (
        f"median {statistics.median(ordered) * 1000:.0f} ms, p90 {p90 * 1000:.0f} ms, max {ordered[-1] * 1000:.0f} ms"
    )


def read_counts(path: Path) -> collections.Counter[str]:
    time.sleep(0.6)  # one dump interval
    return collections.Counter(json.loads(path.read_text())) if path.exists() else collections.Counter()


def print_phase(name: str, seconds: float, cpu: float, counts: collections.Counter[str]) -> None:
    requests = collections.Counter({k: v for k, v in counts.items() if " " in k and k.split(" ", 1)[0].isupper()})
    wakeups = ", ".join(f"{k}={v}" for k, v in sorted(counts.items()) if k not in requests)
    total = sum(requests.values())
    top = ", ".join(f"{k}={v}" for k, v in requests.most_common(8)) + (f"; {wakeups}" if wakeups else "")
    print(f"| {name} | {seconds:.1f} s | {cpu:.1f} s | {total} | {total / max(seconds, 1e-9):.1f}/s | {top} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--caches", type=int, default=200)
    parser.add_argument("--nodes", type=int, default=50)
    parser.add_argument("--pool-size", type=int, default=5, help="nodes selected by each NodeLocal cache")
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of the idle phase")
    parser.add_argument("--settle", type=float, default=30.0, help="seconds between creation and the idle phase")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    if os.environ.get(COUNTS_ENV):
        run_counted_operator()
        return 0
    return bench(args)


def bench(args: argparse.Namespace) -> int:
    import psutil
    from strata_operator.api.kinds import all_crds
    from strata_testsupport.cluster import install_crds
    from strata_testsupport.kube import new_dynamic_client, resource
    from strata_testsupport.localcluster import LocalCluster

    pools = max(1, args.nodes // args.pool_size)
    with LocalCluster(kwok=False) as cluster, tempfile.TemporaryDirectory() as tmp:
        client = new_dynamic_client(str(cluster.kubeconfig))
        install_crds(client, all_crds())
        resource(client, "v1", "Namespace").create(
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        names = []
        for i in range(args.nodes):
            name = f"gpu-{i:03d}"
            labels = {"bench/pool": str(i % pools), "kubernetes.io/hostname": name}
            resource(client, "v1", "Node").create(
                body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}}
            )
            names.append(name)
        heartbeat = Heartbeat(client, names)
        counts_file = Path(tmp) / "counts.json"
        env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), COUNTS_ENV: str(counts_file)}
        log = (Path(tmp) / "operator.log").open("wb")
        child = subprocess.Popen([sys.executable, __file__], env=env, stdout=log, stderr=subprocess.STDOUT)
        proc = psutil.Process(child.pid)
        try:
            return run_phases(args, client, proc, counts_file, pools)
        finally:
            child.terminate()
            child.wait(30)
            heartbeat.stop.set()
            log.close()


def run_phases(args: argparse.Namespace, client: Any, proc: Any, counts_file: Path, pools: int) -> int:
    from strata_operator.api import API_VERSION
    from strata_testsupport.kube import resource, wait_for

    time.sleep(5)  # the operator connects and lists
    caches = resource(client, API_VERSION, "ModelCache")
    names = [f"model-{i:03d}" for i in range(args.caches)]
    per_pool = args.nodes // pools
    expected = {n: (2 if i % 2 == 0 else per_pool) for i, n in enumerate(names)}
    clock = ChildClock(client, expected)
    rss_peak = proc.memory_info().rss
    cpu0, counts0, t0 = sum(proc.cpu_times()[:2]), read_counts(counts_file), time.monotonic()
    created_at: dict[str, float] = {}
    for i, name in enumerate(names):
        body = {
            "apiVersion": API_VERSION,
            "kind": "ModelCache",
            "metadata": {"name": name},
            "spec": cache_spec(i, pools),
        }
        caches.create(body=body, namespace=NAMESPACE)
        created_at[name] = time.monotonic()

    def statuses() -> list[dict[str, Any]]:
        return [i.get("status") or {} for i in caches.get(namespace=NAMESPACE).to_dict()["items"]]

    def all_children() -> bool:
        nonlocal rss_peak
        rss_peak = max(rss_peak, proc.memory_info().rss)
        return len(clock.complete_at) == len(names)

    wait_for(all_children, timeout=args.timeout, interval=0.5, what="every cache's children")
    reported = wait_for(
        lambda: all(s.get("job") or s.get("desiredNodes") == per_pool for s in statuses()) and time.monotonic(),
        timeout=args.timeout,
        interval=0.5,
        what="every status naming its Jobs",
    )
    t1, cpu1, counts1 = time.monotonic(), sum(proc.cpu_times()[:2]), read_counts(counts_file)
    latencies = [clock.complete_at[n] - created_at[n] for n in names]
    print(
        f"\n{args.caches} ModelCaches (half SharedPVC, half NodeLocal on pools of {per_pool}) across {args.nodes} nodes"
    )
    print(f"create → all children: {summary(latencies)}")
    print(f"create of the first → last status reported: {reported - min(created_at.values()):.1f} s")

    time.sleep(args.settle)  # let the tail of the creation burst (kopf's own patches, late pods) pass
    t1, cpu1, counts1 = time.monotonic(), sum(proc.cpu_times()[:2]), read_counts(counts_file)
    time.sleep(args.idle)
    t2, cpu2, counts2 = time.monotonic(), sum(proc.cpu_times()[:2]), read_counts(counts_file)
    finished = finish_all(client, args.timeout)
    t3 = time.monotonic()
    wait_for(
        lambda: all(s.get("phase") == "Ready" for s in statuses()), timeout=args.timeout, interval=0.5, what="all Ready"
    )
    t4, cpu4, counts4 = time.monotonic(), sum(proc.cpu_times()[:2]), read_counts(counts_file)
    rss_peak = max(rss_peak, proc.memory_info().rss)
    print(f"{finished} preloader pods reported finished in {t3 - t2:.1f} s; all caches Ready {t4 - t3:.1f} s later")
    print(f"operator peak RSS {rss_peak / 2**20:.0f} MiB\n")
    print("| phase | wall | operator CPU | API requests | rate | top requests |")
    print("|---|---|---|---|---|---|")
    print_phase(
        f"create {args.caches} → children + status, then {args.settle:.0f} s", t1 - t0, cpu1 - cpu0, counts1 - counts0
    )
    print_phase(f"idle {args.idle:.0f} s", t2 - t1, cpu2 - cpu1, counts2 - counts1)
    print_phase("pods finish → all Ready", t4 - t2, cpu4 - cpu2, counts4 - counts2)
    return 0


def finish_all(client: Any, timeout: float) -> int:
    """Report every preloader pod as Succeeded with a real FetchResult message, as the kubelet would. The Job
    controller creates pods at its own pace (kube-controller-manager's client is rate-limited), so repeat
    until every Job's pod has been reported."""
    from strata_testsupport.kube import resource

    pods, jobs = resource(client, "v1", "Pod"), resource(client, "batch/v1", "Job")
    job_count = len(jobs.get(namespace=NAMESPACE, label_selector=CACHE_LABEL).to_dict()["items"])
    done: set[str] = set()
    deadline = time.monotonic() + timeout
    while len(done) < job_count and time.monotonic() < deadline:
        for pod in pods.get(namespace=NAMESPACE, label_selector=CACHE_LABEL).to_dict()["items"]:
            job = pod["metadata"]["labels"].get("batch.kubernetes.io/job-name", "")
            if job and job not in done:
                report_succeeded(pods, pod)
                done.add(job)
        time.sleep(0.5)
    return len(done)


def report_succeeded(pods: Any, pod: dict[str, Any]) -> None:
    from strata_loader.contract import FetchResult

    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    index = int(pod["metadata"]["labels"][CACHE_LABEL].rsplit("-", 1)[1])
    result = FetchResult(source=f"s3://bench-models/model-{index}", bytes=16 * 2**30, files=9, seconds=60.0)
    container = pod["spec"]["containers"][0]
    terminated = {"exitCode": 0, "reason": "Completed", "message": result.to_termination_message()}
    state = {"terminated": {**terminated, "startedAt": now, "finishedAt": now}}
    status = {
        "phase": "Succeeded",
        "containerStatuses": [
            {
                "name": container["name"],
                "image": container["image"],
                "imageID": "",
                "ready": False,
                "restartCount": 0,
                "state": state,
            }
        ],
    }
    pods.status.patch(
        name=pod["metadata"]["name"],
        namespace=NAMESPACE,
        body={"status": status},
        content_type="application/strategic-merge-patch+json",
    )


if __name__ == "__main__":
    sys.exit(main())
