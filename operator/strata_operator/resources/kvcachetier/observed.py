"""What one KVCacheTier reconcile read, as `handlers/kvcachetier/io.gather` fills it: the one input of the plan.

Plain data, so every decision is a unit test on values built by hand (the same meaning as ModelCache's
`resources/modelcache/observed.Observed`: observations only; what the plan concludes is in the `Plan`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.core import Problem
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.namespaces import ServerDrops
from strata_operator.resources.kvcachetier.usage import ServerUsage
from strata_operator.resources.kvcachetier.validation import ClusterFacts
from strata_operator.resources.runtime_image import RuntimeImage, default_runtime


@dataclass
class Observed:
    """Everything a tier's plan may look at."""

    tier: TierRef
    previous: Mapping[str, Any] = field(default_factory=dict)
    """The status as stored when the reconcile began."""
    now: str | None = None
    runtime: RuntimeImage = field(default_factory=default_runtime)
    """The operator's configured runtime image (from its settings): the servers' default image."""
    full: bool = True
    """Check and apply the children (a spec change, a child edited, the resync); False: refresh the status only
    (a DaemonSet's pods becoming ready), and ConfigValid keeps what it said."""
    spec: KVCacheTierSpec | None = None
    spec_problem: Problem | None = None
    """Why the spec cannot be used (the model refused what the CRD let through); the plan then only says so."""
    facts: ClusterFacts = field(default_factory=ClusterFacts)
    """What validation judges: selected nodes, the referenced Secrets' keys, the named claim, the CSIDriver."""
    live: Mapping[tuple[str, str], Mapping[str, Any] | None] = field(default_factory=dict)
    """(kind, name) → the object under each of the tier's child names now, None where there is none (`full`)."""
    daemonset: Mapping[str, Any] | None = None
    pods: Sequence[Mapping[str, Any]] = ()
    not_ready_nodes: Mapping[str, str] = field(default_factory=dict)
    """Node name → why it is not Ready (`core.node_not_ready`), for the nodes of servers that are not ready."""
    claim: Mapping[str, Any] | None = None
    """The L2 claim the servers mount (existing or created), where the spec has one."""
    usage: Mapping[str, Any] | None = None
    """status.usage scraped from the ready servers this time; None: not due, or nobody to ask (the stored one stays)."""
    servers: Sequence[tuple[str, ServerUsage | None]] | None = None
    """The same scrape per ready server: (pod and restart count, its metrics or None when it did not answer), for
    the offload verdict; None when usage is."""
    engines: Sequence[tuple[str, Mapping[str, float] | None]] | None = None
    """The tier's consumer engines at the same scrape (pod and restart count, vLLM's prefill sums or None), for the
    recompute time a hit saves; None: not asked."""
    wired: Sequence[Mapping[str, Any]] = ()
    """The pods wired to the tier (its label): the engines the namespaces are recorded from (and scraped)."""
    revisions: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """ModelCache name → the revisions it serves now (`namespaces.current_revisions`; empty when deleted), for every
    cache a wired pod or a status.namespaces record names."""
    consumers: int | None = None
    """The live pods naming the tier (the daemon's pod index); None: not known, the stored count stays."""
    written: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    """(kind, name) → what an earlier round of this reconcile wrote, as the API server stored it."""
    rejected: Problem | None = None
    """A write of an earlier round the API server refused (or a token Secret's name taken): the plan says why."""
    dropped: Mapping[tuple[str, str, str], Sequence[ServerDrops]] = field(default_factory=dict)
    """A namespace record's key → what each server answered to this reconcile's drops."""
