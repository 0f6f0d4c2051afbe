"""KV servers run the runtime image the operator is configured with unless the spec names one."""

from __future__ import annotations

import pytest
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.daemonset import build_daemonset
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.runtime_image import RUNTIME_IMAGE_ENV

TIER = TierRef("kv", "serving", "uid", 1)


def _image(spec: KVCacheTierSpec) -> str:
    daemonset = build_daemonset(spec, TIER, "hash")
    return str(daemonset["spec"]["template"]["spec"]["containers"][0]["image"])


def test_configured_runtime_image_is_the_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUNTIME_IMAGE_ENV, "registry.local/strata-runtime:dev")
    assert _image(KVCacheTierSpec()) == "registry.local/strata-runtime:dev"


def test_spec_image_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(RUNTIME_IMAGE_ENV, "registry.local/strata-runtime:dev")
    assert _image(KVCacheTierSpec(image="mirror.local/runtime:1")) == "mirror.local/runtime:1"


def test_without_configuration_the_release_image_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(RUNTIME_IMAGE_ENV, raising=False)
    assert _image(KVCacheTierSpec()).startswith("ghcr.io/strata-dev/strata-runtime:")
