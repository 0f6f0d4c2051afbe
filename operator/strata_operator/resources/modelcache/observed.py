"""What one ModelCache reconcile read, as `handlers/modelcache/io.gather` fills it: the one input of the plan.

Observations only (the same meaning as KVCacheTier's `resources/kvcachetier/observed.Observed`); what the plan
concludes is in its `Plan`.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.core import Problem
from strata_operator.resources.modelcache import capacity, demand, fanout
from strata_operator.resources.modelcache.compile_cache import CaptureLogs
from strata_operator.resources.modelcache.image import ImageLookup
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.runtime_image import RuntimeImage, default_runtime


@dataclass
class Observed:
    """Everything a plan may look at, as read by one gather (plain data: tests build it by hand)."""

    owner: CacheRef
    previous: Mapping[str, Any]
    now: datetime.datetime
    spec: ModelCacheSpec | None = None
    spec_problem: Problem | None = None
    """Why the spec cannot be used (the model or a builder refused it); the plan then only reports it."""
    claim: Mapping[str, Any] | None = None
    """SharedPVC: the live claim under the name the cache fills."""
    storage_class_missing: bool = False
    jobs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Our live Jobs of the mode's role (preload or prepull), by name."""
    pods: Mapping[str, Sequence[Mapping[str, Any]]] = field(default_factory=dict)
    """Pods of the ended Jobs whose result is not recorded yet (their termination message is the result)."""
    nodes: Mapping[str, NodeInfo] = field(default_factory=dict)
    inputs_checked: bool = False
    input_problem: Problem | None = None
    """A Job reference that does not exist (only meaningful when `inputs_checked`)."""
    rejected: Mapping[tuple[str, str], str] = field(default_factory=dict)
    """(kind, name) → the API server's message, for writes of an earlier plan it refused."""
    runtime: RuntimeImage = field(default_factory=default_runtime)
    """The operator's configured runtime image (from its settings): the Jobs' default image and pull Secrets."""
    capacity: capacity.CapacityView | None = None
    """NodeLocal, read with the Job references (`inputs_checked`): node budgets and the other caches' copies."""
    consumers_on: Mapping[str, int] = field(default_factory=dict)
    """NodeLocal: this cache's live consumer pods per node (for each copy's lastUsed)."""
    waiting: Sequence[demand.WaitingPod] = ()
    """NodeLocal: this cache's consumer pods that have not started (they may need an evicted copy back)."""
    peers: fanout.PeerObjects = field(default_factory=fanout.PeerObjects)
    """NodeLocal: the live peer DaemonSet, Service and NetworkPolicy (see `fanout`)."""
    image: ImageLookup | None = None
    """ImageVolume: the registry's answer when gather looked the reference up now (`image.lookup_due`)."""
    consumer_pods: Sequence[Mapping[str, Any]] = ()
    """NodeLocal, or with compileCache on: the pods labelled with the cache's name (their restore reports)."""
    capture_logs: CaptureLogs = field(default_factory=CaptureLogs)
    """compileCache on: what the sidecars' logs of awaited captures said now (their reports, or a refusal)."""
    consumers: int | None = None
    """The live pods that name the cache (the daemon's pod index); None: not known, the stored count stays."""
    resolve_request: str = ""
    """ImageVolume: the value of the annotation strata.dev/resolve-image (a new value resolves again)."""
