"""Chaos check of both controllers on the real local control plane: kill -9 mid-reconcile, peered replicas,
the API server stopped, and after every round a count of duplicate, orphaned, dangling and missing children.

One run, the operator always its own process (`python -m strata_operator.cli run`):
- N fake Ready nodes (kept Ready by a heartbeat, as in operator_modelcache.py), 40 ModelCaches (SharedPVC with a
  size, NodeLocal over a pool of ~3 nodes, ImageVolume, some with prePull) and 3 KVCacheTiers;
- rounds 1-3: wait until the operator is part-way through creating children (a fresh start, then a batch of spec
  changes), `kill -9` it, change a few more specs while it is down, start it again;
- round 4: two replicas peered (`--peering`, distinct POD_ID); once one is active and the other paused, change
  specs, `kill -9` the active one; the paused one must take over (after kopf's peer lifetime, ~60 s);
- round 5: change specs and, within the operator's 0.5 s debounce, SIGKILL the kube-apiserver; start it again
  after --outage seconds (the reconciles woken by the change meet a dead server and back off).

After each round it waits for convergence and checks, reading only the API (expected names come from the
operator's own builders, given the live claim and node uids):
- missing: a child the current spec implies that does not exist (SharedPVC: its claim and the preload Job of
  the current hash; NodeLocal / prePull: one Job per selected Ready node; a tier: DaemonSet, Service, both
  ConfigMaps, the generated token Secret when auth is default);
- duplicates: more than one Job for the same (cache, role, node);
- orphans: a Strata-labelled Job/PVC/ConfigMap/DaemonSet/Service/Secret with no ownerReference, or whose owner
  (by uid) is gone;
- dangling: one whose owner lives but whose current spec does not imply it (stale hash, unselected node);
- stale generation: a cache or tier whose status.observedGeneration != metadata.generation.

Usage: python bench/operator_chaos.py [--nodes 10] [--caches 40] [--outage 60] [--no-outage] [--converge 180]
Writes bench/results/operator_chaos.json; exits 1 if any count is non-zero in any round.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "testsupport"))
sys.path.insert(0, str(REPO / "bench"))

from operator_modelcache import Heartbeat  # noqa: E402

NAMESPACE = "chaos"
PEERING = "strata-chaos"
POOL_LABEL = "chaos/pool"
GPU_LABEL = "chaos/gpu"
IMAGE = "oci://registry.example/models/llama:v1"
PEERING_CRDS = REPO / "charts" / "strata" / "crds" / "kopf-peering.yaml"
RESULTS = REPO / "bench" / "results" / "operator_chaos.json"
KINDS = [
    ("batch/v1", "Job"),
    ("v1", "PersistentVolumeClaim"),
    ("v1", "ConfigMap"),
    ("apps/v1", "DaemonSet"),
    ("v1", "Service"),
    ("v1", "Secret"),
]


class SteadyHeartbeat(Heartbeat):
    """The bench heartbeat, surviving an API server outage (it beats again once the server is back)."""

    def run(self) -> None:
        while not self.stop.wait(5):
            with contextlib.suppress(Exception):
                self.beat()


class Operator:
    """One operator replica as a child process that dies with this script."""

    def __init__(self, kubeconfig: Path, logdir: Path, name: str, *, peering: bool = False) -> None:
        from strata_testsupport.localcluster.processes import _die_with_parent

        self.name = name
        env = {**os.environ, "KUBECONFIG": str(kubeconfig), "POD_ID": name}
        from strata_testsupport.processes import free_port

        # A port of its own: kopf reads port 0 as "none given" (80), and two replicas may not share one.
        probe = f"--liveness=http://127.0.0.1:{free_port()}/healthz"
        argv = [sys.executable, "-m", "strata_operator.cli", "run", probe]
        if peering:
            argv.append(f"--peering={PEERING}")
        self.log = (logdir / f"operator-{name}-{int(time.time() * 1000)}.log").open("wb")
        self.process = subprocess.Popen(
            argv, env=env, stdout=self.log, stderr=subprocess.STDOUT, preexec_fn=_die_with_parent
        )

    def kill9(self) -> None:
        os.kill(self.process.pid, signal.SIGKILL)
        self.process.wait()
        self.log.close()

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(20)
            except subprocess.TimeoutExpired:
                self.kill9()
        with contextlib.suppress(Exception):
            self.log.close()


# -- the objects ----------------------------------------------------------------------------------------------
def cache_spec(index: int, pools: int, version: int = 0) -> dict[str, Any]:
    """Two in five SharedPVC, two in five NodeLocal over one pool, one in five ImageVolume (every other pre-pulls)."""
    pool = {POOL_LABEL: str((index + version) % pools)}
    kind = index % 5
    if kind in (0, 1):
        storage = {"mode": "SharedPVC", "sharedPVC": {"size": "20Gi"}}
    elif kind in (2, 3):
        # Fan-out off: the checks expect one Job per selected node at once (fan-out's sequence: bench/fanout.py
        # and operator/tests/*/test_modelcache_fanout.py).
        storage = {"mode": "NodeLocal", "nodeLocal": {"nodeSelector": pool, "fanOut": {"enabled": False}}}
    else:
        storage = {"mode": "ImageVolume", "imageVolume": {"prePull": index % 10 == 4, "nodeSelector": pool}}
    source: dict[str, Any] = {"uri": IMAGE if kind == 4 else f"s3://chaos-models/model-{index}"}
    if kind != 4 and version:
        source["revision"] = f"r{version}"  # the URI is immutable; a new revision is a new fetch request
    return {"source": source, "storage": storage}


def tier_spec(index: int, version: int = 0) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {GPU_LABEL: "true"}, "l1": {"size": f"{4 + version}Gi"}}
    if index == 1:
        spec["auth"] = {"disabled": True}
    return spec


class Objects:
    """The caches and tiers this run owns, and the version of each spec (bumped by `mutate`)."""

    def __init__(self, client: Any, caches: int, pools: int) -> None:
        from strata_operator.api import API_VERSION
        from strata_testsupport.kube import resource

        self.caches = resource(client, API_VERSION, "ModelCache")
        self.tiers = resource(client, API_VERSION, "KVCacheTier")
        self.pools, self.api_version = pools, API_VERSION
        self.cache_versions = {i: 0 for i in range(caches)}
        self.tier_versions = {i: 0 for i in range(3)}
        self.turn = 0

    def create(self) -> None:
        for i in self.cache_versions:
            body = {"apiVersion": self.api_version, "kind": "ModelCache", "metadata": {"name": f"mc-{i:02d}"}}
            self.caches.create(body={**body, "spec": cache_spec(i, self.pools)}, namespace=NAMESPACE)
        for i in self.tier_versions:
            body = {"apiVersion": self.api_version, "kind": "KVCacheTier", "metadata": {"name": f"kv-{i}"}}
            self.tiers.create(body={**body, "spec": tier_spec(i)}, namespace=NAMESPACE)

    def mutate(self, count: int, tiers: int = 1) -> list[str]:
        """Change `count` caches (a new revision or another pool: new Jobs, old ones superseded) and `tiers` tiers."""
        changed = []
        picks = [(self.turn * 7 + k * 3) % len(self.cache_versions) for k in range(count)]
        for i in dict.fromkeys(picks):
            self.cache_versions[i] += 1
            spec = cache_spec(i, self.pools, self.cache_versions[i])
            self.caches.patch(
                name=f"mc-{i:02d}",
                namespace=NAMESPACE,
                body={"spec": spec},
                content_type="application/merge-patch+json",
            )
            changed.append(f"mc-{i:02d}")
        for k in range(tiers):
            i = (self.turn + k) % len(self.tier_versions)
            self.tier_versions[i] += 1
            self.tiers.patch(
                name=f"kv-{i}",
                namespace=NAMESPACE,
                body={"spec": tier_spec(i, self.tier_versions[i])},
                content_type="application/merge-patch+json",
            )
            changed.append(f"kv-{i}")
        self.turn += 1
        return changed


# -- the check ------------------------------------------------------------------------------------------------
def items(client: Any, api_version: str, kind: str, **kwargs: Any) -> list[dict[str, Any]]:
    from strata_testsupport.kube import resource

    return list(resource(client, api_version, kind).get(**kwargs).to_dict()["items"])


def node_ready(node: dict[str, Any]) -> bool:
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def expected_cache_children(
    cache: dict[str, Any], claims: dict[str, dict[str, Any]], nodes: list[dict[str, Any]], runtime: Any
) -> tuple[set[tuple[str, str]], int]:
    """(kind, name) of every child the cache's current spec implies, and how many of them cannot be named yet
    (a preload Job's name needs its claim's uid: a missing claim also hides its Job)."""
    from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
    from strata_operator.resources.modelcache import storage
    from strata_operator.resources.modelcache.owner import CacheRef

    owner, spec = CacheRef.from_body(cache), ModelCacheSpec.model_validate(cache["spec"])
    mode, wanted, unnamed = spec.storage.mode, set(), 0
    if mode == StorageMode.SHARED_PVC:
        claim = storage.claim_name(owner, spec)
        wanted.add(("PersistentVolumeClaim", claim))
        if claim in claims:
            job = storage.shared_pvc_preload(owner, spec, claims[claim]["metadata"]["uid"], runtime)[1]
            wanted.add(("Job", job["metadata"]["name"]))
        else:
            unnamed += 1
        return wanted, unnamed
    if mode == StorageMode.NODE_LOCAL:
        selector, build = spec.storage.node_local.node_selector, storage.node_preload  # type: ignore[union-attr]
    elif spec.storage.image_volume and spec.storage.image_volume.pre_pull:
        selector, build = spec.storage.image_volume.node_selector, storage.node_prepull
    else:
        return wanted, 0
    for node in nodes:
        labels = node["metadata"].get("labels") or {}
        if node_ready(node) and all(labels.get(k) == v for k, v in selector.items()):
            job = build(owner, spec, node["metadata"]["name"], node["metadata"]["uid"], runtime)[1]
            wanted.add(("Job", job["metadata"]["name"]))
    return wanted, 0


def expected_tier_children(tier: dict[str, Any]) -> set[tuple[str, str]]:
    from strata_operator.api.kvcachetier import KVCacheTierSpec
    from strata_operator.resources.kvcachetier.auth import token_secret
    from strata_operator.resources.kvcachetier.names import TierRef

    ref, spec = TierRef.from_body(tier), KVCacheTierSpec.model_validate(tier["spec"])
    wanted = {
        ("DaemonSet", ref.daemonset),
        ("Service", ref.service),
        ("ConfigMap", ref.config_map),
        ("ConfigMap", ref.connection_config_map),
    }
    token = token_secret(spec, ref)
    if token is not None and token.generated:
        wanted.add(("Secret", token.name))
    return wanted


def check(client: Any, runtime: Any) -> dict[str, Any]:
    """One reading of the API: the counts, and what each count is made of."""
    from strata_operator.resources.core import MANAGED_BY, MANAGED_BY_LABEL
    from strata_operator.resources.modelcache.jobs import NODE_ANNOTATION
    from strata_operator.resources.modelcache.names import CACHE_LABEL, ROLE_LABEL

    owners = {o["metadata"]["uid"]: o for o in items(client, "strata.dev/v1alpha1", "ModelCache", namespace=NAMESPACE)}
    owners |= {
        o["metadata"]["uid"]: o for o in items(client, "strata.dev/v1alpha1", "KVCacheTier", namespace=NAMESPACE)
    }
    nodes = items(client, "v1", "Node")
    children: dict[tuple[str, str], dict[str, Any]] = {}
    for api_version, kind in KINDS:
        for selector in (f"{MANAGED_BY_LABEL}={MANAGED_BY}", CACHE_LABEL):
            for child in items(client, api_version, kind, namespace=NAMESPACE, label_selector=selector):
                children[(kind, child["metadata"]["name"])] = child
    claims = {name: c for (kind, name), c in children.items() if kind == "PersistentVolumeClaim"}
    details: dict[str, list[str]] = collections.defaultdict(list)
    wanted_by: dict[str, set[tuple[str, str]]] = {}
    for uid, owner in owners.items():
        if owner["kind"] == "ModelCache":
            wanted_by[uid], unnamed = expected_cache_children(owner, claims, nodes, runtime)
            details["missing"] += [f"{owner['metadata']['name']}: a preload Job (no claim)"] * unnamed
        else:
            wanted_by[uid] = expected_tier_children(owner)
        for key in sorted(wanted_by[uid] - children.keys()):
            details["missing"].append(f"{owner['metadata']['name']}: {key[0]}/{key[1]}")
        status = owner.get("status") or {}
        if status.get("observedGeneration") != owner["metadata"].get("generation"):
            details["stale_generation"].append(
                f"{owner['kind']}/{owner['metadata']['name']}: generation {owner['metadata'].get('generation')}, "
                f"observed {status.get('observedGeneration')}"
            )
    per_node: collections.Counter[tuple[str, str, str]] = collections.Counter()
    for (kind, name), child in sorted(children.items()):
        meta = child["metadata"]
        refs = [r for r in meta.get("ownerReferences") or [] if r.get("kind") in ("ModelCache", "KVCacheTier")]
        what = f"{kind}/{name}" + (" (being deleted)" if meta.get("deletionTimestamp") else "")
        if not refs:
            details["orphans"].append(f"{what}: no ownerReference")
            continue
        uid = refs[0]["uid"]
        if uid not in owners:
            details["orphans"].append(f"{what}: owner {refs[0]['kind']}/{refs[0]['name']} ({uid}) is gone")
            continue
        if (kind, name) not in wanted_by[uid]:
            details["dangling"].append(f"{what}: not implied by the spec of {refs[0]['name']}")
        labels = meta.get("labels") or {}
        if kind == "Job" and not meta.get("deletionTimestamp"):
            node = (meta.get("annotations") or {}).get(NODE_ANNOTATION, "")
            per_node[(labels.get(CACHE_LABEL, ""), labels.get(ROLE_LABEL, ""), node)] += 1
    for (cache, role, node), count in sorted(per_node.items()):
        if count > 1:
            details["duplicates"] += [f"{cache}: {count} {role} Jobs for node {node or '(shared claim)'}"] * (count - 1)
    counts = {k: len(details.get(k, [])) for k in ("duplicates", "orphans", "dangling", "missing", "stale_generation")}
    return {"objects": len(children) + len(owners), **counts, "details": dict(details)}


def clean(result: dict[str, Any]) -> bool:
    return all(result[k] == 0 for k in ("duplicates", "orphans", "dangling", "missing", "stale_generation"))


def converge(client: Any, runtime: Any, since: float, timeout: float) -> dict[str, Any]:
    """Check every 2 s until a reading is clean; the result carries the seconds from `since` to that reading."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check(client, runtime)
        except Exception as error:  # the API server coming back
            result = {"objects": 0, "error": repr(error)}
        if "error" not in result and clean(result):
            result["converged_s"] = round(time.monotonic() - since, 1)
            return result
        if time.monotonic() > deadline:
            result["converged_s"] = None
            return result
        time.sleep(2)


def job_names(client: Any) -> set[str]:
    from strata_operator.resources.modelcache.names import CACHE_LABEL

    return {
        j["metadata"]["name"] for j in items(client, "batch/v1", "Job", namespace=NAMESPACE, label_selector=CACHE_LABEL)
    }


def wait_in_flight(client: Any, runtime: Any, before: set[str], timeout: float = 60) -> dict[str, Any]:
    """Until the operator has created some, not all, of the Jobs the specs now imply (or the time runs out)."""
    deadline = time.monotonic() + timeout
    target = None
    while time.monotonic() < deadline:
        if target is None:  # what is still missing, plus what the operator already made while we looked
            reading = check(client, runtime)
            missing = sum(1 for m in reading["details"].get("missing", []) if "Job" in m)
            target = max(1, missing + len(job_names(client) - before))
        new = len(job_names(client) - before)
        if new >= max(1, target // 3):
            return {"jobs_created_before_kill": new, "jobs_to_create": target, "partial": new < target}
        time.sleep(0.1)
    return {"jobs_created_before_kill": len(job_names(client) - before), "jobs_to_create": target, "partial": False}


# -- the rounds -----------------------------------------------------------------------------------------------
def peering_peers(client: Any) -> dict[str, Any]:
    from strata_testsupport.kube import resource

    body = resource(client, "kopf.dev/v1", "ClusterKopfPeering").get(name=PEERING).to_dict()
    return dict(body.get("status") or {})


def run(args: argparse.Namespace) -> int:
    from strata_operator.api.kinds import all_crds
    from strata_operator.handlers.process import runtime_of
    from strata_operator.settings import Settings, peer_priority
    from strata_testsupport.cluster import install_crds
    from strata_testsupport.kube import create_fake_node, new_dynamic_client, resource
    from strata_testsupport.localcluster import LocalCluster

    runtime = runtime_of(Settings.from_env(os.environ))
    pools = max(1, args.nodes // 3)
    rounds: list[dict[str, Any]] = []
    t_start = time.monotonic()
    with LocalCluster(kwok=False) as cluster, tempfile.TemporaryDirectory() as tmp:
        logdir = Path(tmp)
        client = new_dynamic_client(str(cluster.kubeconfig))
        install_crds(client, all_crds() + list(yaml.safe_load_all(PEERING_CRDS.read_text())))
        resource(client, "kopf.dev/v1", "ClusterKopfPeering").create(
            body={"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING}}
        )
        resource(client, "v1", "Namespace").create(
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}
        )
        names = [f"node-{i:02d}" for i in range(args.nodes)]
        for i, name in enumerate(names):
            create_fake_node(client, name, labels={POOL_LABEL: str(i % pools), GPU_LABEL: "true"})
        heartbeat = SteadyHeartbeat(client, names)
        objects = Objects(client, args.caches, pools)
        running: list[Operator] = []

        def record(name: str, kill: dict[str, Any], since: float, notes: str) -> dict[str, Any]:
            result = converge(client, runtime, since, args.converge)
            row = {"round": name, **kill, "notes": notes, **result}
            rounds.append(row)
            print_row(row)
            for what, lines in result.get("details", {}).items():
                for line in lines[:8]:
                    print(f"    {what}: {line}", flush=True)
            return result

        try:
            print(f"control plane up; {args.nodes} nodes, {pools} pools, {args.caches} caches, 3 tiers")
            print_header()
            # rounds 1-3: a single replica, kill -9 mid-reconcile
            for number in (1, 2, 3):
                before = job_names(client)
                if number == 1:
                    running.append(Operator(cluster.kubeconfig, logdir, "solo"))
                    objects.create()
                    changed = "created 40 caches + 3 tiers"
                else:
                    changed = f"changed {len(objects.mutate(args.mutate))} specs"
                kill = wait_in_flight(client, runtime, before)
                running.pop().kill9()
                down = objects.mutate(3, tiers=1)
                time.sleep(1)
                since = time.monotonic()
                running.append(Operator(cluster.kubeconfig, logdir, "solo"))
                record(f"{number}: kill -9", kill, since, f"{changed}; killed; {len(down)} specs changed while down")
            running.pop().stop()

            # round 4: two peered replicas, the active one killed
            a, b = "replica-a", "replica-b"
            active_id = a if peer_priority(a) > peer_priority(b) else b
            replicas = {n: Operator(cluster.kubeconfig, logdir, n, peering=True) for n in (a, b)}
            running += replicas.values()
            from strata_testsupport.kube import wait_for

            wait_for(lambda: len(peering_peers(client)) >= 2, timeout=60, interval=0.5, what="both peers")
            time.sleep(3)
            before = job_names(client)
            objects.mutate(args.mutate)
            kill = wait_in_flight(client, runtime, before)
            replicas[active_id].kill9()
            running.remove(replicas[active_id])
            since = time.monotonic()
            objects.mutate(3, tiers=1)
            record(
                "4: peered, active killed", kill, since, f"killed {active_id} (higher priority), 3 specs changed after"
            )

            # round 5: the API server stopped while the operator runs
            if args.outage > 0:
                before = job_names(client)
                objects.mutate(args.mutate)
                # Within the daemons' 0.5 s debounce: the watch events are in, the reconciles meet a dead server.
                time.sleep(0.3)
                kill = {"jobs_created_before_kill": len(job_names(client) - before), "jobs_to_create": None}
                apiserver = next(p for p in cluster.processes if p.name == "kube-apiserver")
                os.killpg(apiserver.process.pid, signal.SIGKILL)  # no graceful drain: requests in flight fail
                apiserver.stop()
                cluster.processes.remove(apiserver)
                time.sleep(args.outage)
                since = time.monotonic()
                cluster._start_apiserver()  # same port, certificates and etcd
                kill["jobs_when_api_back"] = len(job_names(client) - before)
                back = check(client, runtime)  # what was left to do when the API server came back
                kill["left_when_api_back"] = {k: back[k] for k in ("missing", "dangling", "stale_generation")}
                notes = (
                    f"kube-apiserver SIGKILLed, restarted after {args.outage:.0f} s; the peered survivor kept running"
                )
                record(f"5: API server down {args.outage:.0f} s", kill, since, notes)
            else:
                print("round 5 (API server outage) skipped: --outage 0")
        finally:
            for operator in running:
                operator.stop()
            heartbeat.stop.set()
            keep = REPO / "bench" / "results" / "operator_chaos_logs"
            if any(not clean(r) for r in rounds if "error" not in r) or any("error" in r for r in rounds):
                keep.mkdir(parents=True, exist_ok=True)
                for log in logdir.glob("operator-*.log"):
                    (keep / log.name).write_bytes(log.read_bytes())
                print(f"operator logs kept in {keep}")
    total = time.monotonic() - t_start
    failed = [r["round"] for r in rounds if "error" in r or not clean(r)]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(
        json.dumps(
            {"nodes": args.nodes, "caches": args.caches, "tiers": 3, "seconds": round(total, 1), "rounds": rounds},
            indent=2,
        )
        + "\n"
    )
    print(f"\n{len(rounds)} rounds in {total:.0f} s; results in {RESULTS.relative_to(REPO)}")
    for r in rounds:
        for what, lines in r.get("details", {}).items():
            for line in lines[:15]:
                print(f"  round {r['round']}: {what}: {line}")
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    return 1 if failed else 0


COLUMNS = (
    "round",
    "objects",
    "duplicates",
    "orphans",
    "dangling",
    "missing",
    "stale_generation",
    "converged_s",
    "in flight",
)


def print_header() -> None:
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "---|" * len(COLUMNS))


def print_row(row: dict[str, Any]) -> None:
    flight = f"{row.get('jobs_created_before_kill')}/{row.get('jobs_to_create')} Jobs"
    if "jobs_when_api_back" in row:
        left = ", ".join(f"{k} {v}" for k, v in row["left_when_api_back"].items())
        flight += f" ({row['jobs_when_api_back']} Jobs and {left} when the API was back)"
    cells = [row.get(c, "") for c in COLUMNS[:-1]] + [flight]
    cells[7] = "timeout" if row.get("converged_s") is None else f"{row['converged_s']} s"
    print("| " + " | ".join(str(c) for c in cells) + " |", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=10)
    parser.add_argument("--caches", type=int, default=40)
    parser.add_argument("--mutate", type=int, default=12, help="specs changed to start each round's reconciles")
    parser.add_argument("--outage", type=float, default=60.0, help="seconds the API server is down; 0 skips it")
    parser.add_argument("--converge", type=float, default=180.0, help="seconds a round may take to converge")
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
