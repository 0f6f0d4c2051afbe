"""The operator's configured runtime image and pull Secrets reach ModelCache Jobs too: the handlers pass the
settings to the plan, and the plan to every Job builder."""

from __future__ import annotations

import datetime

from strata_operator import settings
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.handlers.process import runtime_of
from strata_operator.resources.modelcache import storage
from strata_operator.resources.modelcache.jobs import JobShape, PodMounts, build_job
from strata_operator.resources.modelcache.observed import Observed
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.plan import plan

OWNER = CacheRef(name="llama", namespace="serving", uid="uid-1", generation=1)
SPEC = ModelCacheSpec.model_validate(
    {"source": {"uri": "s3://models/llama"}, "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}}}
)


CONFIGURED = settings.Settings.from_env(
    {"STRATA_RUNTIME_IMAGE": "registry.local/strata-runtime:dev", "STRATA_IMAGE_PULL_SECRETS": "regcred"}
)


def test_planned_preload_jobs_take_the_configured_image_and_pull_secrets() -> None:
    claim = storage.build_claim(OWNER, SPEC)
    claim["metadata"]["uid"] = "claim-uid"
    observed = Observed(
        owner=OWNER,
        previous={},
        now=datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC),
        spec=SPEC,
        claim=claim,
        inputs_checked=True,
        runtime=runtime_of(CONFIGURED),
    )
    (job,) = [a.body for a in plan(observed).actions if a.body["kind"] == "Job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["containers"][0]["image"] == "registry.local/strata-runtime:dev"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_the_configured_image_is_part_of_the_request_hash() -> None:
    """A new runtime image is a new Job: the preload runs again with it."""
    default, _ = storage.shared_pvc_preload(OWNER, SPEC, "claim-uid")
    configured, _ = storage.shared_pvc_preload(OWNER, SPEC, "claim-uid", runtime_of(CONFIGURED))
    assert default != configured


def test_settings_passed_explicitly_win() -> None:
    runtime = runtime_of(settings.Settings.from_env({"STRATA_IMAGE_PULL_SECRETS": "a,b"}))
    shape = JobShape("llama-preload", "preload", ["strata-loader"], ["fetch"], PodMounts(), "h")
    pod = build_job(OWNER, SPEC, shape, runtime=runtime)["spec"]["template"]["spec"]
    assert pod["imagePullSecrets"] == [{"name": "a"}, {"name": "b"}]
    assert pod["containers"][0]["image"] == runtime.image
