"""An hf:// ModelCache end to end: the preloader Job the operator renders is run for real (`strata-loader` with
the Job's own args and env) against a real Hub-compatible server (olah), and what it wrote as its termination
message is reported as the kubelet would (no kubelet runs here: see `test_modelcache_support`). So the commit a
branch named reaches status.resolvedRevision, and a Hub error reaches the Degraded condition, through the real
loader and the real operator.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from safetensors.numpy import save
from strata_loader.contract import ENV_TERMINATION_MESSAGE_PATH, FetchResult
from strata_testsupport.hub import HubServer
from strata_testsupport.kube import resource

from .test_modelcache_support import condition, create_cache, finish_job, get_cache, unique, wait_for_status

pytestmark = pytest.mark.integration


def run_preloader(k8s: DynamicClient, namespace: str, job_name: str, hub: HubServer, dest: Path) -> FetchResult:
    """Run the Job's container command as the pod would, into `dest` instead of the claim's mount."""
    job = resource(k8s, "batch/v1", "Job").get(name=job_name, namespace=namespace).to_dict()
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["strata-loader"]
    args = list(container["args"])
    args[2] = str(dest)  # fetch SOURCE DEST ...
    env = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    env["HF_HOME"] = str(dest.parent / "hf-home")  # the pod's /tmp/hf, here
    message = dest.parent / "termination-log"
    run_env = {**os.environ, **env, **hub.env(), ENV_TERMINATION_MESSAGE_PATH: str(message)}
    run_env.pop("HF_TOKEN", None)
    subprocess.run([sys.executable, "-m", "strata_loader", *args], env=run_env, capture_output=True, timeout=300)
    return FetchResult.from_termination_message(message.read_text())


def hub_spec(repo: str, revision: str | None = None) -> dict[str, Any]:
    source: dict[str, Any] = {"uri": f"hf://{repo}"}
    if revision:
        source["revision"] = revision
    return {"source": source, "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}}}


def test_the_commit_a_branch_named_lands_in_status(
    k8s: DynamicClient, operator: Any, namespace: str, hub_server: HubServer, tmp_path: Path
) -> None:
    import numpy as np

    repo = hub_server.create_repo()
    hub_server.commit(repo, {"model.safetensors": save({"w": np.arange(64, dtype=np.float32)})}, "one")
    sha = hub_server.commit(repo, {"config.json": b"{}"}, "two")
    name = unique("hub")
    create_cache(k8s, namespace, name, hub_spec(repo, "main"))
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("job"), "a preloader Job")

    result = run_preloader(k8s, namespace, status["job"], hub_server, tmp_path / "model")
    assert result.succeeded, result.error
    assert result.revision == sha
    finish_job(k8s, namespace, status["job"], result)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Ready", "phase Ready")
    assert status["resolvedRevision"] == sha
    assert status["totalFiles"] == 2


def test_a_missing_repository_is_reported_in_the_condition(
    k8s: DynamicClient, operator: Any, namespace: str, hub_server: HubServer, tmp_path: Path
) -> None:
    name = unique("hub")
    spec = hub_spec("strata/not-there")
    spec["preload"] = {"backoffLimit": 0}
    create_cache(k8s, namespace, name, spec)
    status = wait_for_status(k8s, namespace, name, lambda s: s.get("job"), "a preloader Job")

    result = run_preloader(k8s, namespace, status["job"], hub_server, tmp_path / "model")
    assert not result.succeeded
    finish_job(k8s, namespace, status["job"], result, succeeded=False)
    wait_for_status(k8s, namespace, name, lambda s: s.get("phase") == "Failed", "phase Failed")
    degraded = condition(get_cache(k8s, namespace, name), "Degraded")
    assert degraded["reason"] == "PreloadFailed"
    assert "hf://strata/not-there" in degraded["message"] and "HF_TOKEN" in degraded["message"]
