"""KV servers run the runtime image the operator is configured with unless the spec names one; the
configured pull policy and pull Secrets reach the pod spec."""

from __future__ import annotations

from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.handlers.process import runtime_of
from strata_operator.resources.kvcachetier.children import build_children
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.settings import Settings

TIER = TierRef("kv", "serving", "uid", 1)
ENV = {
    "STRATA_RUNTIME_IMAGE": "registry.local/strata-runtime:dev",
    "STRATA_RUNTIME_IMAGE_PULL_POLICY": "Always",
    "STRATA_IMAGE_PULL_SECRETS": "regcred, mirror-cred",
}


def _pod(spec: KVCacheTierSpec, env: dict[str, str]) -> dict[str, Any]:
    runtime = runtime_of(Settings.from_env(env))
    return dict(build_children(spec, TIER, runtime).daemonset["spec"]["template"]["spec"])


def test_configured_runtime_image_is_the_default() -> None:
    assert _pod(KVCacheTierSpec(), ENV)["containers"][0]["image"] == "registry.local/strata-runtime:dev"


def test_spec_image_wins() -> None:
    pod = _pod(KVCacheTierSpec(image="mirror.local/runtime:1"), ENV)
    assert pod["containers"][0]["image"] == "mirror.local/runtime:1"
    assert "imagePullPolicy" not in pod["containers"][0]  # the configured policy is about the configured image


def test_without_configuration_the_release_image_is_used() -> None:
    pod = _pod(KVCacheTierSpec(), {})
    assert pod["containers"][0]["image"].startswith("ghcr.io/strata-dev/strata-runtime:")
    assert pod["containers"][0]["imagePullPolicy"] == "IfNotPresent"
    assert "imagePullSecrets" not in pod


def test_configured_pull_policy_and_pull_secrets_reach_the_pod_spec() -> None:
    pod = _pod(KVCacheTierSpec(), ENV)
    assert pod["containers"][0]["imagePullPolicy"] == "Always"
    assert pod["imagePullSecrets"] == [{"name": "regcred"}, {"name": "mirror-cred"}]


def test_spec_pull_policy_wins() -> None:
    pod = _pod(KVCacheTierSpec.model_validate({"imagePullPolicy": "Never"}), ENV)
    assert pod["containers"][0]["imagePullPolicy"] == "Never"
