"""The Argo CD health checks in charts/strata/README.md, run as Lua (lupa) against status objects shaped like
the operator's: the snippets users paste must parse and give the right verdicts."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from strata_operator.resources.modelcache import status as st

README = Path(__file__).resolve().parents[1] / "strata" / "README.md"


@pytest.fixture(scope="module", autouse=True)
def lua(require_tool) -> None:
    try:
        import lupa  # noqa: F401
    except ImportError:
        require_tool("lupa (Lua for Python, in the dev extra) not installed")


def health_scripts() -> dict[str, str]:
    """The `resource.customizations.health.*` entries of the README's argocd-cm block, by kind."""
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), re.S)
    (block,) = [b for b in blocks if "resource.customizations.health" in b]
    data = yaml.safe_load(block)["data"]
    return {key.rsplit("_", 1)[1]: script for key, script in data.items()}


def to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, dict):
        return runtime.table_from({k: to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([to_lua(runtime, v) for v in value])
    return value


def health(kind: str, obj: dict[str, Any]) -> tuple[str, str]:
    import lupa

    runtime = lupa.LuaRuntime(unpack_returned_tuples=True)
    check = runtime.eval(f"function(obj)\n{health_scripts()[kind]}\nend")
    result = check(to_lua(runtime, obj))
    return result["status"], result["message"]


def resource(generation: int, status: dict[str, Any] | None) -> dict[str, Any]:
    obj: dict[str, Any] = {"metadata": {"name": "x", "generation": generation}}
    if status is not None:
        obj["status"] = status
    return obj


def condition(kind: str, status: str, message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": "Test", "message": message}


@pytest.mark.parametrize("kind", ["ModelCache", "KVCacheTier"])
def test_new_and_stale_objects_are_progressing(kind):
    assert health(kind, resource(1, None))[0] == "Progressing"
    stale = {"observedGeneration": 1, "conditions": [condition("Ready", "True")]}
    status, message = health(kind, resource(2, stale))
    assert status == "Progressing" and "generation 2" in message


def test_modelcache_verdicts():
    """Statuses rendered by the operator's own status code, not written by hand."""

    def rendered(outcome: st.Outcome) -> dict[str, Any]:
        return st.render_status({}, outcome, 3)

    assert health("ModelCache", resource(3, rendered(st.ready_outcome({}, "12 files")))) == ("Healthy", "12 files")
    preloading = rendered(st.preloading_outcome({}, "preloading"))
    assert health("ModelCache", resource(3, preloading)) == ("Progressing", "preloading")
    nodes = [{"name": "node-1", "phase": "Ready"}, {"name": "node-2", "phase": "Failed", "message": "node-2 failed"}]
    degraded = rendered(st.nodes_outcome(nodes, ready_reason="AllNodesReady", ready_message="", fields={}))
    status, message = health("ModelCache", resource(3, degraded))
    assert status == "Degraded" and "node-2 failed" in message
    failed = rendered(st.failed_outcome({}, "PreloadFailed", "no bucket"))
    assert health("ModelCache", resource(3, failed)) == ("Degraded", "no bucket")


def test_kvcachetier_verdicts():
    ready = {
        "observedGeneration": 1,
        "conditions": [condition("ConfigValid", "True"), condition("Ready", "True", "3/3 servers")],
    }
    assert health("KVCacheTier", resource(1, ready)) == ("Healthy", "3/3 servers")
    rolling = {"observedGeneration": 1, "conditions": [condition("Ready", "False", "1/3 servers ready")]}
    assert health("KVCacheTier", resource(1, rolling)) == ("Progressing", "1/3 servers ready")
    invalid = {
        "observedGeneration": 1,
        "conditions": [
            condition("ConfigValid", "False", "l1.size exceeds node memory"),
            condition("Stalled", "True", "l1.size exceeds node memory"),
            condition("Ready", "False"),
        ],
    }
    assert health("KVCacheTier", resource(1, invalid)) == ("Degraded", "l1.size exceeds node memory")


def test_one_script_serves_both_kinds():
    """One condition vocabulary, so one health check: a kind-specific script would drift."""
    scripts = health_scripts()
    assert set(scripts) == {"ModelCache", "KVCacheTier"} and len(set(scripts.values())) == 1
