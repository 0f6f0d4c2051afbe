"""Which evicted copies a pod needs again (pure): the operator brings those back, and only those.

An evicted copy stays away while nobody needs it (fetching it back at once would evict another idle copy, and
the two would take turns). A consumer pod of the cache that is waiting (Pending and not yet bound, gated by the
webhook or not; or bound to a node whose copy is gone) needs a copy on a node it could run on: its nodeSelector
and required node affinity, apart from Strata's own model labels (they say where copies are, which is what is
being decided), match the node, and the node is still in the cache's selection. A waiting pod that could already
run where a copy is (or is being made) needs nothing more; otherwise it brings back one evicted copy, the most
recently used one it could run on. So k waiting pods bring back at most k copies.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata_operator.resources.modelcache.names import MODEL_LABEL_PREFIX
from strata_operator.resources.modelcache.nodes import NodeInfo


@dataclass(frozen=True)
class WaitingPod:
    """A consumer pod of the cache that has not started: where it may go."""

    name: str
    node_name: str = ""
    node_selector: Mapping[str, str] = field(default_factory=dict)
    terms: Sequence[Mapping[str, Any]] = ()
    """Required node affinity's nodeSelectorTerms (any one must match); empty: no such affinity."""

    @classmethod
    def from_body(cls, pod: Mapping[str, Any]) -> WaitingPod | None:
        """None for a pod that is running, ended or going away (it needs no copy brought back)."""
        meta, spec, status = pod.get("metadata") or {}, pod.get("spec") or {}, pod.get("status") or {}
        if status.get("phase", "Pending") != "Pending" or meta.get("deletionTimestamp"):
            return None
        required = ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        ) or {}
        return cls(
            name=str(meta.get("name", "")),
            node_name=str(spec.get("nodeName") or ""),
            node_selector=dict(spec.get("nodeSelector") or {}),
            terms=list(required.get("nodeSelectorTerms") or []),
        )

    def could_run_on(self, node: NodeInfo) -> bool:
        if self.node_name:
            return self.node_name == node.name
        if not all(node.labels.get(k) == v for k, v in self.node_selector.items() if not _ours(k)):
            return False
        return not self.terms or any(_term_matches(t, node) for t in self.terms)


def _ours(key: str) -> bool:
    return key.startswith(MODEL_LABEL_PREFIX)


def _term_matches(term: Mapping[str, Any], node: NodeInfo) -> bool:
    expressions = [e for e in term.get("matchExpressions") or [] if not _ours(str(e.get("key", "")))]
    fields = {"metadata.name": node.name}
    return all(_requirement(e, node.labels) for e in expressions) and all(
        _requirement(f, fields) for f in term.get("matchFields") or []
    )


def _requirement(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    """One NodeSelectorRequirement, as the scheduler reads it (Gt/Lt compare integers)."""
    key, op, values = str(expr.get("key", "")), expr.get("operator"), [str(v) for v in expr.get("values") or []]
    value = labels.get(key)
    if op == "In":
        return value in values
    if op == "NotIn":
        return value not in values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt") and value is not None and len(values) == 1:
        try:
            have, bound = int(value), int(values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound
    return False


def needed_again(
    waiting: Sequence[WaitingPod],
    nodes: Mapping[str, NodeInfo],
    evicted: Mapping[str, str],
    having: Collection[str],
) -> dict[str, str]:
    """Evicted node → the waiting pod it is brought back for.

    `evicted`: the cache's evicted nodes still in its selection, with each copy's lastUsed; `having`: selected
    nodes whose copy is there or on its way."""
    chosen: dict[str, str] = {}
    for pod in sorted(waiting, key=lambda p: p.name):
        fits = [n for n in sorted(nodes) if pod.could_run_on(nodes[n])]
        if any(n in having or n in chosen for n in fits):
            continue
        options = [n for n in fits if n in evicted]
        if options:
            best = max(options, key=lambda n: (evicted[n], n))
            chosen[best] = pod.name
    return chosen
