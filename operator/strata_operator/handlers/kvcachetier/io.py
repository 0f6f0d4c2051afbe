"""Every read and write of the KVCacheTier controller, and the only module of it that talks to the API server or
to a server: `gather` (what a plan looks at: the tier's objects, its server pods, the pods wired to it and the
revisions of the caches they name, and every `USAGE_INTERVAL_SECONDS` the servers' and engines' metrics),
`execute` (a plan's writes: the token Secret, the children, the KV namespace drops) and `write_status`. The
generic API calls are `strata_operator.kube`, the decisions between them `resources/kvcachetier/plan.py`.

The servers are asked over RESP with the tier's token, through the KV server's own client (`strata_kv.client`):
`STRATA.NAMESPACES` lists what each holds, `STRATA.DROPNS <namespace>` drops one through the store's own delete
path (so KV events report the blocks removed). A server that does not answer leaves its record pending; the next
reconcile tries again. Metrics are scraped over HTTP with short timeouts and bounded concurrency; a failed scrape
never fails a reconcile.
"""

from __future__ import annotations

import base64
import json
import logging
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Any

from kubernetes.dynamic.exceptions import BadRequestError, InternalServerError, UnprocessibleEntityError
from strata_kv.client import KVClient, KVError

from strata_operator import kube
from strata_operator.api import API_VERSION
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.handlers.common import ensure_token_secret
from strata_operator.resources.core import KV_TIER_LABEL, Problem, label_selector, node_not_ready, parse_spec
from strata_operator.resources.kvcachetier import namespaces as ns
from strata_operator.resources.kvcachetier.children import child_names
from strata_operator.resources.kvcachetier.engines import parse_engine_metrics
from strata_operator.resources.kvcachetier.names import KIND, TierRef
from strata_operator.resources.kvcachetier.observed import Observed
from strata_operator.resources.kvcachetier.plan import Plan
from strata_operator.resources.kvcachetier.status import endpoints, pod_ready
from strata_operator.resources.kvcachetier.storage import l2_claim_name
from strata_operator.resources.kvcachetier.usage import ServerUsage, parse_metrics, summarize
from strata_operator.resources.kvcachetier.validation import ClusterFacts, node_selected
from strata_operator.resources.runtime_image import RuntimeImage

log = logging.getLogger(__name__)

DROP_TIMEOUT_SECONDS = 30.0
"""One server's answer to one namespace command; dropping a large namespace deletes every block file."""
SCRAPE_TIMEOUT_SECONDS = 2.0
SCRAPE_CONCURRENCY = 16
SCRAPE_DEADLINE_SECONDS = 10.0
"""All scrapes of one tier together: servers that have not answered by then count as unreachable, so
hundreds of unreachable pods cannot hold the timer for minutes."""

Dropped = dict[tuple[str, str, str], list[ns.ServerDrops]]
Stored = dict[tuple[str, str], dict[str, Any]]


@dataclass(frozen=True)
class Applied:
    """A child as our last apply left it: an event carrying this version is our own write."""

    resource_version: str
    generation: int


AppliedChildren = dict[tuple[str, str, str], Applied]
"""(kind, namespace, name) -> Applied, kept in the controller's memory: after a restart the daemons' first
reconciles re-apply everything."""


def read_tier(name: str, namespace: str) -> dict[str, Any] | None:
    return kube.read(API_VERSION, KIND, name, namespace)


def gather(
    body: Mapping[str, Any],
    runtime: RuntimeImage,
    *,
    full: bool,
    scrape: bool,
    now: str | None = None,
    consumers: int | None = None,
) -> Observed:
    """Every read the tier's plan looks at. `full`: also what validation judges and the objects under the
    children's names; `scrape`: also the ready servers' metrics (status.usage); `consumers`: the daemon's count
    of live pods naming the tier, passed through to status.consumers."""
    tier = TierRef.from_body(body)
    previous = dict(body.get("status") or {})
    observed = Observed(tier=tier, previous=previous, now=now, runtime=runtime, full=full, consumers=consumers)
    spec, observed.spec_problem = parse_spec(KVCacheTierSpec, body)
    if spec is None:
        return observed
    observed.spec = spec
    if full:
        observed.facts = cluster_facts(spec, tier)
        observed.live = {
            (kind, name): kube.read(v, kind, name, tier.namespace) for v, kind, name in child_names(spec, tier)
        }
    daemonset_key = ("DaemonSet", tier.daemonset)
    if daemonset_key in observed.live:
        observed.daemonset = observed.live[daemonset_key]
    else:
        observed.daemonset = kube.read("apps/v1", "DaemonSet", tier.daemonset, tier.namespace)
    observed.pods = kube.list_objects(
        "v1", "Pod", namespace=tier.namespace, label_selector=label_selector(tier.selector_labels())
    )
    observed.not_ready_nodes = not_ready_nodes(observed.pods)
    claim_name = l2_claim_name(spec, tier)
    observed.claim = kube.read("v1", "PersistentVolumeClaim", claim_name, tier.namespace) if claim_name else None
    observed.wired = kube.list_objects(
        "v1", "Pod", namespace=tier.namespace, label_selector=label_selector({KV_TIER_LABEL: tier.name})
    )
    observed.revisions = cache_revisions(tier, previous, observed.wired)
    if scrape:
        try:
            servers = read_servers(observed.pods, spec)
            if servers is not None:
                observed.usage = summarize((u for _, u in servers if u is not None), instances=len(servers))
                observed.servers = servers
                if spec.offload_verdict.engine_metrics_port:
                    observed.engines = read_engines(observed.wired, spec.offload_verdict.engine_metrics_port)
        except Exception:  # metrics are informative: a failed scrape never fails the reconcile
            log.exception("scraping the KV servers' metrics failed")
    return observed


def not_ready_nodes(pods: Sequence[Mapping[str, Any]]) -> dict[str, str]:
    """Why each node of a server that is not ready is not Ready itself (nodes that are Ready left out). Read only
    for those servers' nodes: usually none, a few while nodes come and go."""
    nodes = sorted({n for pod in pods if (n := pod.get("spec", {}).get("nodeName")) and not pod_ready(pod)})
    answers = {name: kube.read("v1", "Node", name, None) for name in nodes}
    why = {name: node_not_ready(node) if node is not None else "the Node is deleted" for name, node in answers.items()}
    return {name: reason for name, reason in why.items() if reason is not None}


def cache_revisions(
    tier: TierRef, previous: Mapping[str, Any], wired: Sequence[Mapping[str, Any]]
) -> dict[str, frozenset[str]]:
    """The current revisions of every cache a wired pod or an earlier namespace record names."""
    caches = {r["modelCache"] for r in previous.get("namespaces") or []}
    caches |= {s.model_cache for pod in wired if (s := ns.served_by(pod)) is not None}
    return {
        name: ns.current_revisions(kube.read(API_VERSION, "ModelCache", name, tier.namespace))
        for name in sorted(caches)
    }


def cluster_facts(spec: KVCacheTierSpec, tier: TierRef) -> ClusterFacts:
    """Selected nodes, referenced Secrets' keys, the existing L2 claim and the node socket's CSIDriver, as
    validation needs them."""
    nodes = kube.list_objects("v1", "Node", label_selector=label_selector(spec.node_selector))
    facts = ClusterFacts(nodes=[n for n in nodes if node_selected(spec, n)])
    refs = []
    if spec.auth.secret_ref is not None:
        refs.append(spec.auth.secret_ref.name)
    if spec.l2 and spec.l2.s3 and spec.l2.s3.secret_ref:
        refs.append(spec.l2.s3.secret_ref.name)
    for name in refs:
        secret = kube.read("v1", "Secret", name, tier.namespace)
        # Only the key names: validation never needs the values, so they are not kept.
        facts.secrets[name] = None if secret is None else dict.fromkeys(secret.get("data") or {}, "")
    fs = spec.l2.fs if spec.l2 else None
    if fs is not None and fs.pvc is not None and fs.pvc.claim_name is not None:
        facts.existing_claim = kube.read("v1", "PersistentVolumeClaim", fs.pvc.claim_name, tier.namespace)
        facts.claim_checked = True
    if spec.node_socket.enabled:
        facts.socket_driver = kube.read("storage.k8s.io/v1", "CSIDriver", spec.node_socket.driver, None)
        facts.socket_driver_checked = True
    return facts


def execute(
    plan: Plan, tier: TierRef, applied: AppliedChildren | None = None
) -> tuple[Stored, Problem | None, Dropped]:
    """Carry out a plan's writes: the token Secret, then the children, then the drops. Returns what was written,
    as stored, the first write refused (after which no other child is written), and what each server answered
    to each drop (the drops do not depend on the children)."""
    stored, rejected = apply_children(plan, tier, applied)
    dropped = {d.key: drop(d, tier.namespace) for d in plan.drops}
    return stored, rejected, dropped


def apply_children(plan: Plan, tier: TierRef, applied: AppliedChildren | None) -> tuple[Stored, Problem | None]:
    stored: Stored = {}
    if plan.token_secret is not None:
        live, conflict = ensure_token_secret(tier, plan.token_secret)
        if live is None:
            return stored, conflict or Problem("SecretNotFound", f"Secret {plan.token_secret.name!r} went away")
        stored[("Secret", plan.token_secret.name)] = live
    for action in plan.actions:
        try:
            result = kube.apply(action.body)
        except (BadRequestError, UnprocessibleEntityError, InternalServerError) as error:
            # 400/422: the child is invalid as rendered; 500: the API server could not even type it (a
            # mistyped free-form field such as affinity). Reported, not raised: retried by the timer, not in a loop.
            kind, name = action.key
            return stored, Problem(
                "ChildRejected", f"the API server refused {kind} {name}: {kube.api_error_message(error)}"
            )
        stored[action.key] = result
        meta = result["metadata"]
        if applied is not None:
            applied[(result["kind"], meta["namespace"], meta["name"])] = Applied(
                str(meta.get("resourceVersion", "")), int(meta.get("generation") or 0)
            )
    return stored, None


STATUS_CONFLICT_RETRIES = 5


def write_status(tier: TierRef, patch: Mapping[str, Any], read: Mapping[str, Any]) -> None:
    """The one writer of a tier's status, `read` being the tier as this reconcile read it.

    status.collectedNamespaces is a log, and the bytes a drop freed are reported nowhere else once the drop is
    done: two reconciles of one tier at once (a peering handover, or a reconcile run beside the operator) would
    each write the log as they read it plus their own entries, and the later write would erase the other's. So a
    write that adds to the log is conditional on the version read; when another writer got there first, its new
    entries go on top of the log as it now stands (the rest of the status is level-based: the next reconcile
    puts it right). A write that adds nothing leaves the log out: its copy is the log as it was read, and a
    writer that added entries since would lose them."""
    added = ns.added_collected(read.get("status") or {}, patch)
    if not added:
        unchanged_log = {k: v for k, v in patch.items() if k != "collectedNamespaces"}
        kube.patch_status(API_VERSION, KIND, tier.name, tier.namespace, unchanged_log)
        return
    version = read["metadata"].get("resourceVersion")
    for _ in range(STATUS_CONFLICT_RETRIES):
        try:
            kube.patch_status(API_VERSION, KIND, tier.name, tier.namespace, patch, resource_version=version)
            return
        except kube.Conflict:
            fresh = read_tier(tier.name, tier.namespace)
            if fresh is None:
                return
            version = fresh["metadata"].get("resourceVersion")
            log_now = (fresh.get("status") or {}).get("collectedNamespaces") or []
            patch = {**patch, "collectedNamespaces": ns.extend_collected(log_now, added)}
    raise kube.Conflict(f"{KIND} {tier.namespace}/{tier.name}: status changed {STATUS_CONFLICT_RETRIES} times over")


# -- the KV namespace drops ---------------------------------------------------------------------------------
class TokenUnreadable(Exception):
    """The tier's token Secret lacks the key the servers' token is under."""


def drop(planned: ns.Drop, namespace: str) -> list[ns.ServerDrops]:
    """One drop on every server; a token that cannot be read leaves the record pending, saying why."""
    try:
        token = read_token(planned.token, namespace)
    except TokenUnreadable as error:
        return [ns.ServerDrops("token", error=str(error))]
    return [drop_on(server, host, planned.port, token, planned.model) for server, host in planned.servers]


def read_token(ref: tuple[str, str] | None, namespace: str) -> bytes | None:
    """The token the servers expect (the one the tier's clients are given); None when the tier has none."""
    if ref is None:
        return None
    name, key = ref
    data = (kube.read("v1", "Secret", name, namespace) or {}).get("data") or {}
    if key not in data:
        raise TokenUnreadable(f"the token Secret {name} has no key {key}")
    return base64.b64decode(data[key]).strip()


def drop_on(server: str, host: str | None, port: int, token: bytes | None, model: str) -> ns.ServerDrops:
    """Drop every namespace of `model` one server holds."""
    if host is None:
        return ns.ServerDrops(server, error="not ready")
    try:
        with KVClient(host, port, token=token, timeout=DROP_TIMEOUT_SECONDS) as client:
            held = json.loads(client.call("STRATA.NAMESPACES"))
            freed = {}
            for namespace in sorted(n for n in held if ns.belongs(n, model)):
                answer = json.loads(client.call("STRATA.DROPNS", namespace))
                total = answer.get("freed") or {}
                freed[namespace] = (sum(t["blocks"] for t in total.values()), int(answer.get("bytes") or 0))
        return ns.ServerDrops(server, freed=freed)
    except (OSError, KVError, ValueError) as error:
        log.warning("collecting the namespaces of %s on %s failed: %s", model, server, error)
        return ns.ServerDrops(server, error=str(error)[:200])


# -- metrics ---------------------------------------------------------------------------------------------------
def scrape(host: str, port: int, timeout: float = SCRAPE_TIMEOUT_SECONDS) -> ServerUsage | None:
    """One server's usage, or None when it does not answer in time (it is counted as unreachable)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as response:
            return parse_metrics(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def scrape_engine(host: str, port: int, timeout: float = SCRAPE_TIMEOUT_SECONDS) -> dict[str, float] | None:
    """One engine's prefill sums from vLLM's /metrics, or None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=timeout) as response:
            return parse_engine_metrics(response.read().decode())
    except (urllib.error.URLError, OSError, ValueError):
        return None


def scrape_all(
    hosts: Iterable[str],
    port: int,
    deadline: float = SCRAPE_DEADLINE_SECONDS,
    read: Callable[[str, int], Any] = scrape,
) -> list[Any]:
    """`read(host, port)` of every host in order (a server's usage by default), None for those that failed or
    missed the deadline."""
    hosts = list(hosts)
    if not hosts:
        return []
    pool = ThreadPoolExecutor(max_workers=min(SCRAPE_CONCURRENCY, len(hosts)))
    futures = [pool.submit(read, host, port) for host in hosts]
    wait(futures, timeout=deadline)
    pool.shutdown(wait=False, cancel_futures=True)
    return [f.result() if f.done() and not f.cancelled() else None for f in futures]


def read_servers(
    pods: Sequence[Mapping[str, Any]], spec: KVCacheTierSpec
) -> list[tuple[str, ServerUsage | None]] | None:
    """Each ready server among `pods` as (`pod/restarts`, its metrics or None when it did not answer); None when
    none is ready. The identity changes when a server restarts: its counters start again from zero."""
    ready = [e for e in endpoints(pods, spec.port) if e.get("ready") and e.get("address")]
    if not ready:
        return None
    restarts = {
        pod.get("metadata", {}).get("name"): sum(
            int(c.get("restartCount") or 0) for c in pod.get("status", {}).get("containerStatuses") or []
        )
        for pod in pods
    }
    results = scrape_all((e["address"].rsplit(":", 1)[0] for e in ready), spec.metrics_port)
    return [(f"{e['pod']}/{restarts.get(e['pod'], 0)}", u) for e, u in zip(ready, results, strict=True)]


def _restarts(pod: Mapping[str, Any]) -> int:
    return sum(int(c.get("restartCount") or 0) for c in pod.get("status", {}).get("containerStatuses") or [])


def read_engines(consumers: Sequence[Mapping[str, Any]], port: int) -> list[tuple[str, dict[str, float] | None]]:
    """Each running, ready consumer pod as (`pod/restarts`, its vLLM prefill sums or None when it did not answer)."""
    ready = [
        pod
        for pod in consumers
        if pod.get("status", {}).get("podIP")
        and not pod.get("metadata", {}).get("deletionTimestamp")
        and any(c.get("type") == "Ready" and c.get("status") == "True" for c in pod["status"].get("conditions") or [])
    ]
    results = scrape_all((p["status"]["podIP"] for p in ready), port, read=scrape_engine)
    return [(f"{p['metadata']['name']}/{_restarts(p)}", sums) for p, sums in zip(ready, results, strict=True)]
