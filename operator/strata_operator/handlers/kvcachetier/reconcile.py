"""One KVCacheTier reconcile: read the cluster, validate, apply the children, write status if it changed.

Level-based: every trigger (the resource itself, a child's event, the resync) wakes the tier's daemon
(`handlers/controller.py`), which runs this same code, so reconciles of one tier never overlap and converge on
the same state.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import kopf
from kubernetes.dynamic.exceptions import BadRequestError, InternalServerError, UnprocessibleEntityError
from pydantic import ValidationError

from strata_operator import kube
from strata_operator import settings as strata_settings
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.conditions import set_condition
from strata_operator.handlers.kvcachetier import io
from strata_operator.handlers.process import runtime_of
from strata_operator.resources.core import label_selector
from strata_operator.resources.kvcachetier.auth import TOKEN_BYTES, build_token_secret, token_secret
from strata_operator.resources.kvcachetier.children import Children, build_children
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.status import (
    CONFIG_VALID,
    Observed,
    compute_status,
    status_changed,
    transition_events,
)
from strata_operator.resources.kvcachetier.storage import l2_claim_name
from strata_operator.resources.kvcachetier.validation import (
    ClusterFacts,
    Problem,
    node_selected,
    nodes_too_small,
    validate,
)


@dataclass(frozen=True)
class Applied:
    """A child as our last apply left it: an event carrying this version is our own write."""

    resource_version: str
    generation: int


AppliedChildren = dict[tuple[str, str, str], Applied]
"""(kind, namespace, name) -> Applied, kept in the controller's memory: after a restart the daemons' first
reconciles re-apply everything."""


@dataclass
class Outcome:
    """What one reconcile did (returned for tests and the benchmark)."""

    applied: bool
    status_written: bool
    status: dict[str, Any]


def gather_facts(spec: KVCacheTierSpec, tier: TierRef) -> ClusterFacts:
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


def check(spec: KVCacheTierSpec, tier: TierRef) -> tuple[list[Problem], list[str]]:
    """Problems that block applying, and warnings that do not (servers that fit on only some nodes)."""
    facts = gather_facts(spec, tier)
    problems = validate(spec, facts)
    warnings = []
    if not problems and (small := nodes_too_small(spec, facts.nodes)):
        warnings.append(f"servers do not fit on {len(small)} selected node(s): {', '.join(small[:5])}")
    return problems, warnings


def apply_children(children: Children, tier: TierRef, applied: AppliedChildren | None = None) -> Problem | None:
    """Apply in dependency order; a child the API server refuses (e.g. a claim shrunk) becomes a Problem.

    Nothing is applied while any child's name is taken by an object the tier did not create: forced apply
    would make the tier its controller, and deleting the tier would then garbage-collect it.
    """
    for child in children.in_apply_order():
        if problem := name_conflict(child, tier):
            return problem
    for child in children.in_apply_order():
        try:
            stored = kube.apply(child)
        except (BadRequestError, UnprocessibleEntityError, InternalServerError) as error:
            # 400/422: the child is invalid as rendered; 500: the API server could not even type it (a
            # mistyped free-form field such as affinity). Reported, not raised: retried by the timer, not in a loop.
            kind, name = child["kind"], child["metadata"]["name"]
            return Problem("ChildRejected", f"the API server refused {kind} {name}: {kube.api_error_message(error)}")
        meta = stored["metadata"]
        if applied is None:
            continue
        applied[(stored["kind"], meta["namespace"], meta["name"])] = Applied(
            str(meta.get("resourceVersion", "")), int(meta.get("generation") or 0)
        )
    return None


def ensure_generated_token(spec: KVCacheTierSpec, tier: TierRef) -> tuple[Problem | None, str | None]:
    """Create the tier's token Secret once; an existing one is kept as it is (clients hold its token).

    Returns a name conflict, or the Secret's uid: a Secret deleted by hand comes back with a new token and a
    new uid, which rolls the servers (they read the token when they start). Created, not applied: the
    operator needs no right to patch Secrets, and cannot rewrite a token.
    """
    token = token_secret(spec, tier)
    if token is None or not token.generated:
        return None, None
    live = kube.read("v1", "Secret", token.name, tier.namespace)
    if live is None:
        live = kube.create(build_token_secret(tier, secrets.token_urlsafe(TOKEN_BYTES)))
        if live is None:  # created meanwhile by someone else: read what is there now
            live = kube.read("v1", "Secret", token.name, tier.namespace)
    if live is not None and not tier.created(live):
        return name_conflict({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": token.name}}, tier), None
    return None, str((live or {}).get("metadata", {}).get("uid") or "")


def name_conflict(child: Mapping[str, Any], tier: TierRef) -> Problem | None:
    kind, name = child["kind"], child["metadata"]["name"]
    live = kube.read(child["apiVersion"], kind, name, tier.namespace)
    if live is None or tier.created(live):
        return None
    hint = {
        "PersistentVolumeClaim": " (or set l2.fs.pvc.claimName to use that claim)",
        "Secret": " (or set auth.secretRef to use that Secret's token)",
    }.get(kind, "")
    return Problem(
        "NameConflict",
        f"{kind} {name!r} already exists in namespace {tier.namespace!r} and was not created by KVCacheTier "
        f"{tier.name!r}: rename the tier, or rename or delete that {kind}{hint}",
    )


def observe(tier: TierRef) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """The DaemonSet and its pods, as they are now."""
    daemonset = kube.read("apps/v1", "DaemonSet", tier.daemonset, tier.namespace)
    pods = kube.list_objects(
        "v1", "Pod", namespace=tier.namespace, label_selector=label_selector(tier.selector_labels())
    )
    return daemonset, pods


EventSink = Callable[[Mapping[str, Any], str, str, str], None]


def post_event(body: Mapping[str, Any], type_: str, reason: str, message: str) -> None:
    """A Kubernetes Event on the resource; outside a kopf handler (tests, benchmarks) there is no poster."""
    try:
        kopf.event(cast(Any, dict(body)), type=type_, reason=reason, message=message[:1024])
    except LookupError:
        logging.getLogger(__name__).info("%s %s: %s", type_, reason, message)


def reconcile(
    body: Mapping[str, Any],
    *,
    full: bool = True,
    events: EventSink = post_event,
    now: str | None = None,
    settings: strata_settings.Settings | None = None,
    applied: AppliedChildren | None = None,
) -> Outcome | None:
    """Reconcile the resource named in `body` (re-read, so a stale trigger cannot write a stale status).

    `settings`: the operator's (kopf's memo holds them); the process's own when called outside kopf.
    `applied`: where to record the versions our applies left, so their watch events can be told apart.
    """
    meta = body["metadata"]
    current = io.read_tier(meta["name"], meta["namespace"])
    if current is None or current["metadata"].get("deletionTimestamp"):
        return None
    tier = TierRef.from_body(current)
    process = settings or strata_settings.current()
    return _reconcile(current, tier, full=full, events=events, now=now, settings=process, applied=applied)


def _reconcile(
    current: dict[str, Any],
    tier: TierRef,
    *,
    full: bool,
    events: EventSink,
    now: str | None,
    settings: strata_settings.Settings,
    applied: AppliedChildren | None,
) -> Outcome:
    previous = current.get("status") or {}
    try:
        spec = KVCacheTierSpec.model_validate(current.get("spec") or {})
    except ValidationError as error:
        return _reject_spec(current, tier, previous, error, now, events)
    problems, warnings = check(spec, tier) if full else (None, [])
    done, config_digest = False, None
    if full and not problems:
        # Built only from a spec that passed validation: the builders read its quantities.
        rejection, token_uid = ensure_generated_token(spec, tier)
        children = build_children(spec, tier, runtime_of(settings), token_version=token_uid)
        rejection = rejection or apply_children(children, tier, applied)
        done, config_digest = rejection is None, children.config_hash
        if rejection is not None:
            problems = [rejection]
    daemonset, pods = observe(tier)
    claim_name = l2_claim_name(spec, tier)
    claim = kube.read("v1", "PersistentVolumeClaim", claim_name, tier.namespace) if claim_name else None
    observed = Observed(
        daemonset=daemonset,
        pods=pods,
        problems=problems,
        claim=claim,
        config_hash=None if problems else config_digest,
        warnings=warnings,
    )
    status = compute_status(spec, tier, observed, previous, now=now)
    written = _write_if_changed(current, tier, previous, status, events)
    return Outcome(applied=done, status_written=written, status=status)


def _write_if_changed(
    current: Mapping[str, Any],
    tier: TierRef,
    previous: Mapping[str, Any],
    status: dict[str, Any],
    events: EventSink,
) -> bool:
    if not status_changed(previous, status):
        return False
    io.write_tier_status(tier.name, tier.namespace, status)
    for type_, reason, message in transition_events(previous.get("conditions") or [], status["conditions"]):
        events(current, type_, reason, message)
    return True


def _reject_spec(
    current: Mapping[str, Any],
    tier: TierRef,
    previous: Mapping[str, Any],
    error: ValidationError,
    now: str | None,
    events: EventSink,
) -> Outcome:
    """A spec the operator's model refuses (the CRD let it through): say so, change nothing else."""
    message = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
    conditions = set_condition(
        previous.get("conditions") or [],
        CONFIG_VALID,
        False,
        "SpecInvalid",
        message,
        generation=tier.generation,
        now=now,
    )
    status = {"observedGeneration": tier.generation, "conditions": conditions}
    written = _write_if_changed(current, tier, previous, status, events)
    return Outcome(applied=False, status_written=written, status=status)
