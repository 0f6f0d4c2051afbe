"""Download once, fan out (NodeLocal over several nodes): the first node reads the source; the others read the
files from nodes whose copy is Ready.

The sequence, level-based like the rest of the plan:
1. Seeding: one node (the first by name, or one whose Job already runs) gets a Job reading the source with
   `--verify checksums`, so its manifest records a SHA-256 per file; the other nodes wait, without Jobs.
2. Once a copy is Ready (its node carries the cache's `=Ready` label), a per-cache peer DaemonSet runs
   `strata-loader serve-peer` on the nodes with that label (only the cache's own directory, by hostPath,
   read-only; the restricted security context; the token from a Secret the operator creates and owns), behind
   a headless Service; a
   NetworkPolicy admits only this cache's preload pods. When a peer pod is ready, the waiting nodes get Jobs
   with `--peer http://<service>.<namespace>.svc:8477`, which resolves to every ready peer.
3. No ready peer `peerWaitSeconds` after the first copy was Ready, or a failed first copy: the waiting nodes
   read the source themselves (phase Origin).
4. Every selected node Ready: the DaemonSet is pointed at no node, so no peer pod runs (Done). The operator
   holds no delete right on DaemonSets and Services (by design); they go with the cache.
A node whose Job already exists keeps it, whichever way it reads, so a change of phase never restarts a copy.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from strata_loader import contract

from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.resources.core import GeneratedToken, is_subset
from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache import storage
from strata_operator.resources.modelcache.jobs import PodMounts
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.peers import (
    Adjust,
    as_seed,
    build_peer_daemonset,
    build_peer_network_policy,
    build_peer_service,
    from_peers,
    peer_name,
    peer_token,
)
from strata_operator.resources.runtime_image import RuntimeImage

TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"
NODE_WAITING = "Waiting"
"""A node's phase while it waits for the first copy or a peer: in progress, not blocked."""
PHASE_SEEDING = "Seeding"
PHASE_SERVING = "Serving"
PHASE_ORIGIN = "Origin"
PHASE_DONE = "Done"

ORIGIN, PEERS, WAIT = "origin", "peers", "wait"
JobBuilder = Callable[[str, str], tuple[str, dict[str, Any]]]


def active(spec: ModelCacheSpec, wanted: Mapping[str, NodeInfo]) -> bool:
    """Fan-out applies to NodeLocal caches with it enabled and more than one selected node."""
    return spec.storage.mode == StorageMode.NODE_LOCAL and storage.node_local(spec).fan_out.enabled and len(wanted) > 1


@dataclass
class Decision:
    """What fan-out decides for one plan: how each node reads, and the peer objects."""

    builder: JobBuilder
    waiting: dict[str, str] = field(default_factory=dict)
    """Nodes that get no Job yet → why."""
    apply: list[dict[str, Any]] = field(default_factory=list)
    token_secret: GeneratedToken | None = None
    """The Secret that must exist before `apply` (created once, with a random token, by the handler)."""
    status: dict[str, Any] | None = None


@dataclass(frozen=True)
class PeerObjects:
    """The live peer objects, as gather read them (None: absent)."""

    daemonset: Mapping[str, Any] | None = None
    service: Mapping[str, Any] | None = None
    network_policy: Mapping[str, Any] | None = None


def decide(
    owner: CacheRef,
    spec: ModelCacheSpec,
    wanted: Mapping[str, NodeInfo],
    previous: Mapping[str, Any],
    jobs: Mapping[str, Any],
    peers: PeerObjects,
    now: datetime.datetime,
    runtime: RuntimeImage,
) -> Decision:
    """How each wanted node reads, given the previous node states and the live Jobs and peer objects."""

    pin = st.pinned_revision(spec.source.uri, spec.source.revision, previous)
    before = {s["name"]: s for s in previous.get("nodes") or []}
    trusted = trusted_manifest(previous.get("fanOut") or {}, [before[n] for n in sorted(wanted) if n in before])

    def build(how: str, pinned: bool = True) -> JobBuilder:
        peers = from_peers(owner, trusted) if trusted else None
        adjust = _pinned({ORIGIN: None, PEERS: peers, "seed": as_seed}[how], pin if pinned else None)
        return lambda node, uid: storage.node_preload(owner, spec, node, uid, runtime, adjust=adjust)

    if not active(spec, wanted):
        decision = Decision(builder=_stable(jobs, previous, build, lambda _node: ORIGIN))
        if peers.daemonset is not None:  # fan-out no longer applies: no peer pod should run
            decision.apply.append(build_peer_daemonset(owner, spec, runtime, paused=True))
            decision.apply = [b for b in decision.apply if not is_subset(b, peers.daemonset)]
        return decision

    ready = {n for n in wanted if before.get(n, {}).get("phase") == st.PHASE_READY}
    fan_before = previous.get("fanOut") or {}
    running = {n for n in wanted if _has_job(n, jobs, before, build, wanted)}
    seed = None if ready else (min(running) if running else min(wanted))
    failed_seed = seed is not None and before.get(seed, {}).get("phase") == st.PHASE_FAILED
    service = peer_name(owner)
    # Every key, always: status is written as a merge patch, where a key left out would keep its old value.
    status: dict[str, Any] = {"service": service, "peersReady": None, "waitingSince": None, "manifestSha256": trusted}

    if ready == set(wanted):
        status.update(phase=PHASE_DONE, message="every selected node holds a verified copy; no peer runs")
        decision = Decision(builder=_stable(jobs, previous, build, lambda _n: ORIGIN), status=status)
        if peers.daemonset is not None:
            paused = build_peer_daemonset(owner, spec, runtime, paused=True)
            if not is_subset(paused, peers.daemonset):
                decision.apply.append(paused)
        return decision

    desired_ds = build_peer_daemonset(owner, spec, runtime, paused=False)
    # Without a trusted manifest no fetcher could use a peer: the nodes wait, then read the source.
    peers_ready = _ready_pods(desired_ds, peers.daemonset) if trusted else 0
    since = _parse(fan_before.get("waitingSince")) if ready else None
    if ready and peers_ready == 0 and since is None:
        since = now
    waiting_since = since.strftime(TIME_FORMAT) if since is not None else None
    wait_s = storage.node_local(spec).fan_out.peer_wait_seconds
    timed_out = since is not None and now >= since + datetime.timedelta(seconds=wait_s)
    to_origin = timed_out or failed_seed

    def fresh(node: str) -> str:
        if node == seed:
            return "seed"
        if peers_ready:
            return PEERS
        return ORIGIN if to_origin else WAIT

    decision = Decision(builder=_stable(jobs, previous, build, fresh))
    for node in sorted(wanted):
        if node not in running and node not in ready and fresh(node) == WAIT:
            decision.waiting[node] = (
                f"waiting for a peer: node {seed}'s copy from the source comes first"
                if seed
                else f"waiting for a peer (Service {service}) to serve the copy"
            )
    if ready:
        decision.token_secret = peer_token(owner)
        for body, live in (
            (desired_ds, peers.daemonset),
            (build_peer_service(owner), peers.service),
            (build_peer_network_policy(owner), peers.network_policy),
        ):
            if live is None or not is_subset(body, live):
                decision.apply.append(body)
    if peers_ready:
        status.update(phase=PHASE_SERVING, message=f"{peers_ready} peer(s) serve the copy through Service {service}")
    elif failed_seed:
        status.update(
            phase=PHASE_ORIGIN, message=f"the first copy (node {seed}) failed; the other nodes read the source"
        )
    elif timed_out:
        status.update(
            phase=PHASE_ORIGIN, message=f"no peer was ready within {wait_s}s; the other nodes read the source"
        )
    elif ready:
        status.update(phase=PHASE_SEEDING, message=f"starting peers on the {len(ready)} node(s) with a copy")
    else:
        status.update(phase=PHASE_SEEDING, message=f"node {seed} reads the source once for {len(wanted)} nodes")
    status["peersReady"] = peers_ready
    status["waitingSince"] = waiting_since if not peers_ready else None
    decision.status = status
    return decision


def trusted_manifest(fan_out: Mapping[str, Any], states: list[Mapping[str, Any]]) -> str | None:
    """The manifest digest fetchers accept from peers: the one recorded when the first copy became Ready, while
    a Ready copy still has it; else the one most Ready copies have (ties: the first node's by name). Copies read
    from peers have it byte for byte; one read from the source has its own, and its peer is not used."""
    held = [s["manifestSha256"] for s in states if s.get("phase") == st.PHASE_READY and s.get("manifestSha256")]
    if fan_out.get("manifestSha256") in held:
        return str(fan_out["manifestSha256"])
    return str(max(held, key=held.count)) if held else None


def _pinned(adjust: Adjust | None, revision: str | None) -> Adjust | None:
    """`adjust`, then copy exactly `revision` (the commit the first copies resolved the spec's branch to)."""
    if revision is None:
        return adjust

    def pinned(request: contract.FetchRequest, mounts: PodMounts) -> contract.FetchRequest:
        request = adjust(request, mounts) if adjust is not None else request
        return request.model_copy(update={"revision": revision})

    return pinned


def _stable(
    jobs: Mapping[str, Any],
    previous: Mapping[str, Any],
    build: Callable[..., JobBuilder],
    fresh: Callable[[str], str],
) -> JobBuilder:
    """A node keeps the Job it has (live, or recorded in its state) whichever way that Job reads; a node without
    one gets the way `fresh` says (a waiting node is never built)."""
    before = {s["name"]: s.get("job") for s in previous.get("nodes") or []}

    def builder(node: str, uid: str) -> tuple[str, dict[str, Any]]:
        # (A Job made before the revision was pinned is still this node's Job.)
        options = [build(how, pinned)(node, uid) for how in (ORIGIN, PEERS, "seed") for pinned in (True, False)]
        for built in options:
            name = built[1]["metadata"]["name"]
            if name in jobs or before.get(node) == name:
                return built
        how = fresh(node)
        return build(ORIGIN if how == WAIT else how)(node, uid)

    return builder


def _has_job(node: str, jobs: Mapping[str, Any], before: Mapping[str, Any], build: Callable[[str], JobBuilder],
             wanted: Mapping[str, NodeInfo]) -> bool:  # fmt: skip
    uid = wanted[node].uid
    recorded = (before.get(node) or {}).get("job")
    for how in (ORIGIN, PEERS, "seed"):
        name = build(how)(node, uid)[1]["metadata"]["name"]
        if name in jobs or recorded == name:
            return True
    return False


def _ready_pods(desired: Mapping[str, Any], live: Mapping[str, Any] | None) -> int:
    """Ready peer pods of a DaemonSet that runs what we render now (an outdated one does not count)."""
    if live is None or not is_subset(desired["spec"], live.get("spec")):
        return 0
    status = live.get("status") or {}
    if status.get("observedGeneration") != (live.get("metadata") or {}).get("generation"):
        return 0
    return int(status.get("numberReady") or 0)


def _parse(value: Any) -> datetime.datetime | None:
    """A time this plan wrote into status; None for anything else (the wait then starts again)."""
    try:
        return datetime.datetime.strptime(str(value), TIME_FORMAT).replace(tzinfo=datetime.UTC)
    except ValueError:
        return None
