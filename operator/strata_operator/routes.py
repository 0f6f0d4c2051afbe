"""Every kopf trigger the operator answers, one line each, and the handler it delegates to.

`strata-operator run` (`kopf run -m strata_operator.routes`) imports this module and nothing else registers a
handler: what wakes the operator, and what it then does, is read here. The handlers themselves are plain
functions in `handlers/` and `webhook/`; both kinds follow the same shape (a daemon per object runs its
level-based reconcile, see `handlers/controller.py`; watches only wake it).

Handler ids are the functions' names unless given: kopf keys its progress annotations by them, so a rename
is an upgrade concern.
"""

from __future__ import annotations

import kopf

from strata_operator.api import GROUP, VERSION
from strata_operator.handlers import metrics, process
from strata_operator.handlers.controller import KV_TIERS, MODEL_CACHES, consumer_index
from strata_operator.handlers.kvcachetier import events as tier
from strata_operator.handlers.modelcache import events as cache
from strata_operator.handlers.modelcache.events import CACHE_CHILD
from strata_operator.webhook import gates

CACHES, TIERS = "modelcaches", "kvcachetiers"

# The process: kopf's settings and ours (first: every other startup hook reads them), login, the probe.
kopf.on.startup()(process.on_startup)
kopf.on.login()(process.login)
kopf.on.probe(id="ready")(process.readiness_probe)
kopf.on.startup()(metrics.start_metrics)
kopf.on.cleanup()(metrics.stop_metrics)

# The live consumer pods of both kinds, indexed: each daemon counts them into status.consumers.
kopf.index("", "v1", "pods", id=MODEL_CACHES.index, labels=MODEL_CACHES.selector)(consumer_index(MODEL_CACHES))
kopf.index("", "v1", "pods", id=KV_TIERS.index, labels=KV_TIERS.selector)(consumer_index(KV_TIERS))

# ModelCache: one daemon per cache; its own changes, its children, its pods, its consumers and the nodes wake it.
kopf.on.startup()(cache.remember)
kopf.daemon(GROUP, VERSION, CACHES, cancellation_timeout=10)(cache.modelcache_daemon)
kopf.on.event(GROUP, VERSION, CACHES)(cache.modelcache_changed)
kopf.on.event("apps", "v1", "daemonsets", labels=CACHE_CHILD)(cache.child_changed)
kopf.on.event("batch", "v1", "jobs", labels=CACHE_CHILD)(cache.child_changed)
kopf.on.event("", "v1", "persistentvolumeclaims", labels=CACHE_CHILD)(cache.child_changed)
kopf.on.event("", "v1", "pods", labels=CACHE_CHILD)(cache.pod_changed)
kopf.on.event("", "v1", "pods", labels=MODEL_CACHES.selector, id="modelcache-consumers")(cache.consumer_changed)
kopf.on.event("", "v1", "nodes")(cache.node_changed)
kopf.on.delete(GROUP, VERSION, CACHES)(cache.modelcache_deleted)

# KVCacheTier: one daemon per tier; its own changes, its children and its consumers wake it.
kopf.on.startup()(tier.remember_tiers)
kopf.daemon(GROUP, VERSION, TIERS, cancellation_timeout=10)(tier.tier_daemon)
kopf.on.event(GROUP, VERSION, TIERS)(tier.tier_changed)
kopf.on.event("apps", "v1", "daemonsets", labels=tier.CHILD_LABELS, id="kvcachetier-daemonsets")(tier.child_changed)
kopf.on.event("", "v1", "configmaps", labels=tier.CHILD_LABELS, id="kvcachetier-configmaps")(tier.child_changed)
kopf.on.event("", "v1", "services", labels=tier.CHILD_LABELS, id="kvcachetier-services")(tier.child_changed)
kopf.on.event("", "v1", "persistentvolumeclaims", labels=tier.CHILD_LABELS, id="kvcachetier-persistentvolumeclaims")(
    tier.child_changed
)
kopf.on.event("", "v1", "pods", labels=KV_TIERS.selector, id="kvcachetier-consumers")(tier.consumer_changed)

# The pod admission webhook (served by every replica) and the model-ready scheduling gate it sets.
kopf.on.startup()(gates.start_webhook)
kopf.on.cleanup()(gates.stop_webhook)
kopf.on.event("", "v1", "pods", labels=MODEL_CACHES.selector)(gates.gated_pod_seen)
kopf.on.event(GROUP, VERSION, CACHES)(gates.cache_state_for_gated_pods)
