"""The Argo CD health checks in charts/strata/README.md, run as Lua (strata_testsupport.gitops) against status
objects shaped like the operator's: the snippets users paste must parse and give the right verdicts."""

from __future__ import annotations

from typing import Any

import pytest
from strata_operator.resources.modelcache import status as st
from strata_testsupport.gitops import ArgoHealth, argo_health_scripts, custom_resource


def health(argo_health: ArgoHealth, kind: str, generation: int, status: dict[str, Any] | None) -> tuple[str, str]:
    verdict = argo_health(custom_resource(kind, status, generation=generation))
    return verdict.status, verdict.message


def condition(kind: str, status: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": "Test", "message": message}


@pytest.mark.parametrize("kind", ["ModelCache", "KVCacheTier"])
def test_new_and_stale_objects_are_progressing(kind, argo_health):
    assert health(argo_health, kind, 1, None)[0] == "Progressing"
    stale = {"observedGeneration": 1, "conditions": [condition("Ready", "True")]}
    status, message = health(argo_health, kind, 2, stale)
    assert status == "Progressing" and "generation 2" in message


def test_modelcache_verdicts(argo_health):
    """Statuses rendered by the operator's own status code, not written by hand."""

    def rendered(outcome: st.Outcome) -> dict[str, Any]:
        return st.render_status({}, outcome, 3)

    ready = rendered(st.ready_outcome({}, "12 files"))
    assert health(argo_health, "ModelCache", 3, ready) == ("Healthy", "12 files")
    preloading = rendered(st.preloading_outcome({}, "preloading"))
    assert health(argo_health, "ModelCache", 3, preloading) == ("Progressing", "preloading")
    nodes = [{"name": "node-1", "phase": "Ready"}, {"name": "node-2", "phase": "Failed", "message": "node-2 failed"}]
    degraded = rendered(st.nodes_outcome(nodes, ready_reason="AllNodesReady", ready_message="", fields={}))
    status, message = health(argo_health, "ModelCache", 3, degraded)
    assert status == "Degraded" and "node-2 failed" in message
    failed = rendered(st.failed_outcome({}, "PreloadFailed", "no bucket"))
    assert health(argo_health, "ModelCache", 3, failed) == ("Degraded", "no bucket")


def test_kvcachetier_verdicts(argo_health):
    ready = {
        "observedGeneration": 1,
        "conditions": [condition("ConfigValid", "True"), condition("Ready", "True", "3/3 servers")],
    }
    assert health(argo_health, "KVCacheTier", 1, ready) == ("Healthy", "3/3 servers")
    rolling = {"observedGeneration": 1, "conditions": [condition("Ready", "False", "1/3 servers ready")]}
    assert health(argo_health, "KVCacheTier", 1, rolling) == ("Progressing", "1/3 servers ready")
    invalid = {
        "observedGeneration": 1,
        "conditions": [
            condition("ConfigValid", "False", "l1.size exceeds node memory"),
            condition("Stalled", "True", "l1.size exceeds node memory"),
            condition("Ready", "False"),
        ],
    }
    assert health(argo_health, "KVCacheTier", 1, invalid) == ("Degraded", "l1.size exceeds node memory")


def test_one_script_serves_both_kinds():
    """One condition vocabulary, so one health check: a kind-specific script would drift."""
    scripts = argo_health_scripts()
    assert set(scripts) == {"ModelCache", "KVCacheTier"} and len(set(scripts.values())) == 1
