"""`strata_operator.routes` is the one place kopf triggers are registered: importing every other module registers
nothing, and importing it registers each trigger the operator answers (the handler ids kopf keys its progress by
stay what they were)."""

from __future__ import annotations

import subprocess
import sys

COUNT = """
import importlib, pkgutil, sys, kopf
import strata_operator
names = sorted(m.name for m in pkgutil.walk_packages(strata_operator.__path__, "strata_operator."))
for name in names:
    if name != "strata_operator.routes" and name != "strata_operator.cli":
        importlib.import_module(name)
if len(sys.argv) > 1:
    importlib.import_module("strata_operator.routes")
registry = kopf.get_default_registry()
ids = []
for part in (registry._activities, registry._indexing, registry._watching, registry._spawning, registry._changing):
    ids += [h.id for h in part.get_all_handlers()]
print("\\n".join(sorted(ids)))
"""

TRIGGERS = {
    "cache_state_for_gated_pods", "child_changed", "gated_pod_seen", "kv_tier_consumers",
    "kvcachetier-configmaps", "kvcachetier-consumers", "kvcachetier-daemonsets",
    "kvcachetier-persistentvolumeclaims", "kvcachetier-services", "login", "login_via_client",
    "model_cache_consumers", "modelcache-consumers", "modelcache_changed", "modelcache_daemon",
    "modelcache_deleted", "node_changed", "on_startup", "pod_changed", "ready", "remember", "remember_tiers",
    "start_metrics", "start_webhook", "stop_metrics", "stop_webhook", "tier_changed", "tier_daemon",
}  # fmt: skip


def handler_ids(*, with_routes: bool) -> list[str]:
    argv = [sys.executable, "-c", COUNT] + (["routes"] if with_routes else [])
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()


def test_no_module_but_routes_registers_a_trigger() -> None:
    assert [i for i in handler_ids(with_routes=False) if i != "login_via_client"] == []


def test_routes_registers_every_trigger() -> None:
    assert set(handler_ids(with_routes=True)) == TRIGGERS
