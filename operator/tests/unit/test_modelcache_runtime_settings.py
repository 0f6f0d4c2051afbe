"""The operator's configured runtime image and pull Secrets reach ModelCache Jobs too (through the process's
settings until the ModelCache handlers pass them explicitly)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from strata_operator import settings
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.modelcache import storage
from strata_operator.resources.modelcache.jobs import JobShape, PodMounts, build_job
from strata_operator.resources.modelcache.owner import CacheRef

OWNER = CacheRef(name="llama", namespace="serving", uid="uid-1", generation=1)
SPEC = ModelCacheSpec.model_validate(
    {"source": {"uri": "s3://models/llama"}, "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}}}
)


@pytest.fixture
def configured(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv("STRATA_RUNTIME_IMAGE", "registry.local/strata-runtime:dev")
    monkeypatch.setenv("STRATA_IMAGE_PULL_SECRETS", "regcred")
    settings.reload()
    yield
    monkeypatch.undo()
    settings.reload()


def test_preload_jobs_take_the_configured_image_and_pull_secrets(configured: None) -> None:
    _, job = storage.shared_pvc_preload(OWNER, SPEC, "claim-uid")
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.local/strata-runtime:dev"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_settings_passed_explicitly_win() -> None:
    runtime = settings.Settings.from_env({"STRATA_IMAGE_PULL_SECRETS": "a,b"}).runtime
    shape = JobShape("llama-preload", "preload", ["strata-loader"], ["fetch"], PodMounts(), "h")
    pod = build_job(OWNER, SPEC, shape, runtime=runtime)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}]
    assert pod["containers"][0]["image"] == runtime.image
