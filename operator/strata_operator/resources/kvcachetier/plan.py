"""A KVCacheTier reconcile's decisions: one pure function from what was observed to what to do.

The controller runs the loop both kinds share (`handlers/controller.converge`: gather → plan → execute → settle,
then the status if it changed): `handlers/kvcachetier/io.py` makes every read (`gather`) and fills an `Observed`;
`plan` turns it into the token Secret to ensure, the children to apply, the KV namespaces to drop from the servers
(`namespaces.Drop`), the status (status.consumers and status.namespaces included) and the Events, without touching
the cluster; `io.execute` carries the plan out. A write's answer goes back into the observation (`with_writes`),
so the plan sees what it wrote:
- a generated token's Secret is ensured first: its uid is part of the configuration (a new token rolls the
  servers), so the children and the drops (the servers need the token) are planned (`plan` again) once it exists;
- the status is rendered from the children as the API server stored them and from what each server answered to
  the drops (`settle`), and a child it refused is a Problem (ConfigValid False), never an exception retried in a
  loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.conditions import CONFIG_VALID, now_rfc3339, set_condition, transition_events
from strata_operator.resources.core import (
    SPEC_INVALID,
    Action,
    Event,
    GeneratedToken,
    Problem,
    name_conflict,
    with_consumers,
)
from strata_operator.resources.kvcachetier import namespaces
from strata_operator.resources.kvcachetier.auth import generated_token, token_secret
from strata_operator.resources.kvcachetier.children import build_children
from strata_operator.resources.kvcachetier.names import KIND
from strata_operator.resources.kvcachetier.namespaces import Drop, ServerDrops
from strata_operator.resources.kvcachetier.observed import Observed
from strata_operator.resources.kvcachetier.status import Checked, compute_status
from strata_operator.resources.kvcachetier.storage import l2_claim_name
from strata_operator.resources.kvcachetier.validation import nodes_too_small, validate

CLAIM_HINT = " (or set l2.fs.pvc.claimName to use that claim)"


@dataclass
class Plan:
    status: dict[str, Any]
    checked: Checked = field(default_factory=Checked)
    actions: list[Action] = field(default_factory=list)
    """Children to apply, in dependency order (what the DaemonSet mounts comes first)."""
    events: list[Event] = field(default_factory=list)
    token_secret: GeneratedToken | None = None
    """A Secret that must exist (created once with a random token) before the children are planned."""
    drops: list[Drop] = field(default_factory=list)
    """KV namespaces to drop from every server: records no pod serves whose revision the cache has moved past."""

    @property
    def has_writes(self) -> bool:
        return bool(self.actions or self.token_secret or self.drops)


def plan(observed: Observed) -> Plan:
    """What to do about one KVCacheTier, given what was observed."""
    spec = observed.spec
    if spec is None:
        return _refused(observed, observed.spec_problem or Problem(SPEC_INVALID, "no spec"))
    checked, actions, token = _children(observed) if observed.full else (Checked(problems=None), [], None)
    status, events = _status(spec, observed, checked)
    due = [] if token is not None else _drops(spec, observed)  # the servers need the token the Secret will hold
    return Plan(status=status, checked=checked, actions=actions, events=events, token_secret=token, drops=due)


def _collection(spec: KVCacheTierSpec, observed: Observed) -> tuple[namespaces.Collection, str]:
    now = observed.now or now_rfc3339()
    seen = namespaces.NamespaceObservation(pods=observed.wired, current=observed.revisions, now=now)
    return namespaces.plan_collection(spec, observed.previous, seen), now


def _drops(spec: KVCacheTierSpec, observed: Observed) -> list[Drop]:
    collection, _ = _collection(spec, observed)
    token = token_secret(spec, observed.tier)
    return namespaces.drops(collection, observed.pods, spec.port, (token.name, token.key) if token else None)


def _status(spec: KVCacheTierSpec, observed: Observed, checked: Checked) -> tuple[dict[str, Any], list[Event]]:
    """The status and its Events: the children's, the consumers' count, and the namespace records after what the
    servers answered to this reconcile's drops (none yet when planning)."""
    status = with_consumers(compute_status(spec, observed, checked), observed.previous, observed.consumers)
    events = transition_events(KIND, observed.previous.get("conditions") or [], status["conditions"])
    collection, now = _collection(spec, observed)
    fields, collected = namespaces.settle_collection(collection, observed.dropped, observed.previous, now)
    return {**status, **fields}, events + collected


def _children(observed: Observed) -> tuple[Checked, list[Action], GeneratedToken | None]:
    """The checks the API server cannot make, then the children to apply (none while any name is taken)."""
    spec, tier = observed.spec, observed.tier
    assert spec is not None
    problems = validate(spec, observed.facts)
    warnings = []
    if not problems and (small := nodes_too_small(spec, observed.facts.nodes)):
        warnings.append(f"servers do not fit on {len(small)} selected node(s): {', '.join(small[:5])}")
    if not problems and observed.rejected is not None:
        problems = [observed.rejected]
    if problems:
        return Checked(problems, warnings), [], None
    token_version = None
    token = token_secret(spec, tier)
    if token is not None and token.generated:
        generated = generated_token(tier)
        live = _live(observed, "Secret", generated.name)
        if live is None:  # create it first; the children follow once its uid is known
            return Checked(None, warnings), [], generated
        if conflict := name_conflict(tier, "Secret", generated.name, live, generated.hint):
            return Checked([conflict], warnings), [], None
        token_version = str(live.get("metadata", {}).get("uid") or "")
    # Built only from a spec that passed validation: the builders read its quantities.
    children = build_children(spec, tier, observed.runtime, token_version=token_version)
    ordered = children.in_apply_order()
    for child in ordered:
        kind, name = child["kind"], child["metadata"]["name"]
        hint = CLAIM_HINT if kind == "PersistentVolumeClaim" else ""
        if conflict := name_conflict(tier, kind, name, _live(observed, kind, name), hint):
            return Checked([conflict], warnings), [], None
    return Checked((), warnings, children.config_hash), [Action("apply", child) for child in ordered], None


def settle(observed: Observed, planned: Plan) -> Plan:
    """The plan once it was carried out (`with_writes`): the status of what the API server stored, or of its
    refusal, and of what the servers answered to the drops; nothing left to write, the children not built again."""
    spec = observed.spec
    assert spec is not None  # only a usable spec plans children
    checked = planned.checked
    if observed.rejected is not None:
        checked = Checked([observed.rejected], checked.warnings)
    status, events = _status(spec, observed, checked)
    return Plan(status=status, checked=checked, events=events)


def _live(observed: Observed, kind: str, name: str) -> Any:
    """The object under a child's name: as this reconcile wrote it, else as gather read it."""
    return observed.written.get((kind, name)) or observed.live.get((kind, name))


def _refused(observed: Observed, problem: Problem) -> Plan:
    """A spec the operator's model refuses (the CRD let it through): say so in ConfigValid, change nothing else."""
    previous, tier = observed.previous, observed.tier
    conditions = set_condition(
        previous.get("conditions") or [],
        CONFIG_VALID,
        False,
        problem.reason,
        problem.message,
        generation=tier.generation,
        now=observed.now,
    )
    status = {**previous, "observedGeneration": tier.generation, "conditions": conditions}
    status = with_consumers(status, previous, observed.consumers)
    events = transition_events(KIND, previous.get("conditions") or [], conditions)
    return Plan(status=status, checked=Checked([problem]), events=events)


def with_writes(
    observed: Observed,
    stored: dict[tuple[str, str], dict[str, Any]],
    rejected: Problem | None,
    dropped: Mapping[tuple[str, str, str], Sequence[ServerDrops]] | None = None,
) -> Observed:
    """The observation after an execute: what it wrote, as stored, replaces what gather read (the DaemonSet and
    the claim the status reports on), a refusal becomes the plan's Problem, and the servers' answers to the drops
    are kept for the status."""
    tier, spec = observed.tier, observed.spec
    claim_name = l2_claim_name(spec, tier) if spec is not None else None
    return replace(
        observed,
        written={**observed.written, **stored},
        daemonset=stored.get(("DaemonSet", tier.daemonset), observed.daemonset),
        claim=stored.get(("PersistentVolumeClaim", claim_name or ""), observed.claim),
        rejected=rejected or observed.rejected,
        dropped={**observed.dropped, **(dropped or {})},
    )
