"""Copies on a node that stops being Ready (its kubelet stopped posting status: powered off, partitioned,
restarting), and what happens when it returns.

Such a node keeps its place in status: its state turns NodeNotReady, naming the node and why (the node's own
Ready condition), and keeps what it was in `beforeNodeLoss`. Its Job is kept: its pod goes on, or the Job makes a
new one that resumes the partial copy, once the kubelet answers again; deleting it would leave a pod nobody can
stop on a node nobody can reach. Its `=Ready` label stays: the scheduler keeps new pods off an unreachable node by
its taint, and a copy that is Ready there serves again the moment it returns. When the node is Ready again its
state is what it was, and the plan goes on from there (a Ready copy is Ready at once, a preload resumes). Only the
Node's deletion (a node that will not come back) drops its state and its Job, as for any node no longer selected.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strata_operator.resources.modelcache import status as st
from strata_operator.resources.modelcache.nodes import NodeInfo

BEFORE = "beforeNodeLoss"
"""The node state's field with the phase and message it had when its node stopped being Ready."""


def lost_nodes(
    nodes: Mapping[str, NodeInfo], selector: Mapping[str, str], previous: Mapping[str, Any]
) -> dict[str, NodeInfo]:
    """The selected nodes that are not Ready and had a state: a copy, a Job, or a place in the fan-out. A node
    that is not Ready before it was ever planned for is not lost, just not selected yet."""
    known = {str(s.get("name")) for s in previous.get("nodes") or []}
    return {n: i for n, i in nodes.items() if not i.ready and i.matches(selector) and n in known}


def lost_state(previous: Mapping[str, Any], node: NodeInfo) -> dict[str, Any]:
    """The state of a node that is not Ready: what it was is kept (in `BEFORE` and the other fields), the
    message says why and what happens next."""
    before = dict(previous.get(BEFORE) or {"phase": previous.get("phase"), "message": previous.get("message")})
    kept = {k: v for k, v in previous.items() if k not in ("phase", "message", BEFORE)}
    return {
        **kept,
        "name": node.name,
        "phase": st.PHASE_NODE_NOT_READY,
        BEFORE: {k: v for k, v in before.items() if v is not None},
        "message": f"the node is not Ready: {node.not_ready}; {_what_then(before.get('phase'))}",
    }


def _what_then(phase: Any) -> str:
    if phase == st.PHASE_READY:
        return "its copy is kept and serves again when the node returns"
    if phase == st.PHASE_PRELOADING:
        return "its Job is kept: the copy resumes when the node returns"
    return f"it was {phase}; planned again when the node returns"


def with_returned(previous: Mapping[str, Any], nodes: Mapping[str, NodeInfo]) -> Mapping[str, Any]:
    """`previous` with the state of every node that is Ready again put back as it was before it was lost, so the
    plan resumes from there; unchanged when no node returned."""
    states = previous.get("nodes") or []
    returned = {
        str(s["name"])
        for s in states
        if s.get("phase") == st.PHASE_NODE_NOT_READY and (info := nodes.get(str(s["name"]))) is not None and info.ready
    }
    if not returned:
        return previous
    return {**previous, "nodes": [_restored(s) if s["name"] in returned else s for s in states]}


def _restored(state: Mapping[str, Any]) -> dict[str, Any]:
    before = state.get(BEFORE) or {}
    restored = {k: v for k, v in state.items() if k not in ("phase", "message", BEFORE)}
    restored["phase"] = before.get("phase") or st.PHASE_PENDING
    if before.get("message"):
        restored["message"] = before["message"]
    return restored
