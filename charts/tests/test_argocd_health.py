"""The Argo CD health checks in charts/strata/README.md, run as Lua (strata_testsupport.gitops): the snippets users
paste must parse and read one script for both kinds. Their verdicts on the operator's own statuses, side by side
with kstatus', are operator/tests/unit/test_gitops_verdicts.py."""

from __future__ import annotations

import pytest
from strata_testsupport.gitops import argo_health_scripts, custom_resource


@pytest.mark.parametrize("kind", ["ModelCache", "KVCacheTier"])
def test_new_and_stale_objects_are_progressing(kind, argo_health):
    assert argo_health(custom_resource(kind, None, generation=1)).status == "Progressing"
    ready = {"type": "Ready", "status": "True", "reason": "Test", "message": ""}
    stale = custom_resource(kind, {"observedGeneration": 1, "conditions": [ready]}, generation=2)
    verdict = argo_health(stale)
    assert verdict.status == "Progressing" and "generation 2" in verdict.message


def test_one_script_serves_both_kinds():
    """One condition vocabulary, so one health check: a kind-specific script would drift."""
    scripts = argo_health_scripts()
    assert set(scripts) == {"ModelCache", "KVCacheTier"} and len(set(scripts.values())) == 1
