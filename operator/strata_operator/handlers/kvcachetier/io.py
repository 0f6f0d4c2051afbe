"""The KVCacheTier's reads (`gather`) and writes (`execute`, `write_status`); the generic ones are
`strata_operator.kube`, the decisions between them `resources/kvcachetier/plan.py`."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes.dynamic.exceptions import BadRequestError, InternalServerError, UnprocessibleEntityError

from strata_operator import kube
from strata_operator.api import API_VERSION
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.handlers.common import ensure_token_secret
from strata_operator.handlers.kvcachetier import usage
from strata_operator.resources.core import KV_TIER_LABEL, Problem, label_selector, parse_spec
from strata_operator.resources.kvcachetier.children import child_names
from strata_operator.resources.kvcachetier.names import KIND, TierRef
from strata_operator.resources.kvcachetier.observed import Observed
from strata_operator.resources.kvcachetier.plan import Plan
from strata_operator.resources.kvcachetier.storage import l2_claim_name
from strata_operator.resources.kvcachetier.usage import summarize
from strata_operator.resources.kvcachetier.validation import ClusterFacts, node_selected
from strata_operator.resources.runtime_image import RuntimeImage

log = logging.getLogger(__name__)


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
    body: Mapping[str, Any], runtime: RuntimeImage, *, full: bool, scrape: bool, now: str | None = None
) -> Observed:
    """Every read the tier's plan looks at. `full`: also what validation judges and the objects under the
    children's names; `scrape`: also the ready servers' metrics (status.usage)."""
    tier = TierRef.from_body(body)
    observed = Observed(tier=tier, previous=dict(body.get("status") or {}), now=now, runtime=runtime, full=full)
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
    claim_name = l2_claim_name(spec, tier)
    observed.claim = kube.read("v1", "PersistentVolumeClaim", claim_name, tier.namespace) if claim_name else None
    if scrape:
        try:
            servers = usage.read_servers(observed.pods, spec)
            if servers is not None:
                observed.usage = summarize((u for _, u in servers if u is not None), instances=len(servers))
                observed.servers = servers
                if spec.offload_verdict.engine_metrics_port:
                    consumers = kube.list_objects(
                        "v1", "Pod", namespace=tier.namespace, label_selector=label_selector({KV_TIER_LABEL: tier.name})
                    )
                    observed.engines = usage.read_engines(consumers, spec.offload_verdict.engine_metrics_port)
        except Exception:  # metrics are informative: a failed scrape never fails the reconcile
            log.exception("scraping the KV servers' metrics failed")
    return observed


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
) -> tuple[dict[tuple[str, str], dict[str, Any]], Problem | None]:
    """Carry out a plan's writes in order: the token Secret, then the children. Returns what was written, as
    stored, and the first write refused (after which nothing more is written)."""
    stored: dict[tuple[str, str], dict[str, Any]] = {}
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


def write_status(tier: TierRef, patch: Mapping[str, Any]) -> None:
    """The one writer of a tier's status (the consumers' count aside, `handlers/consumers.py`)."""
    kube.patch_status(API_VERSION, KIND, tier.name, tier.namespace, patch)
