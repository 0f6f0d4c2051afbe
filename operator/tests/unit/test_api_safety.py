"""Spec values that would point Strata's pods at the node itself: system host paths (mounted writable, removed
from on clean-up). Checked here on the models and the generated rules; the API server runs the same rules in the
integration tests."""

from __future__ import annotations

import re
from typing import Any

import pytest
from pydantic import ValidationError
from strata_operator.api import kvcachetier, modelcache
from strata_operator.api.base import SYSTEM_DIRECTORY_PATTERN, UNCLEAN_SEGMENT_PATTERN
from strata_operator.api.crdgen import build_crd
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.api.modelcache import ModelCacheSpec

SYSTEM_PATHS = [
    "/",
    "/etc",
    "/bin",
    "/sbin",
    "/usr",
    "/lib",
    "/lib64",
    "/boot",
    "/dev",
    "/proc",
    "/sys",
    "/run",
    "/var/run",
    "/root",
    "/var",
    "/var/lib",
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/var/lib/docker",
    "/var/lib/etcd",
    "/proc/1/root",
    "/sys/fs/cgroup",
    "/dev/shm",
    "/etc/kubernetes",
    "/boot/efi",
    "/usr/local/models",
    "/var/lib/kubelet/pods",
]
UNCLEAN_PATHS = ["/data/../etc", "/data/..", "/./etc", "/data/.", "/data//models", "//etc", "/data/models/"]
ACCEPTED_PATHS = [
    "/var/lib/strata/models",
    "/var/lib/strata",
    "/mnt/nvme/strata-kv",
    "/data",
    "/opt/models",
    "/etcetera",
    "/usrdata",
    "/variable/lib",
    "/var/lib/kubelet-models",
    "/data/.models/v1",
    "/data/..models",
]


def model_cache(path: str) -> dict[str, Any]:
    return {"source": {"uri": "s3://models/llama"}, "storage": {"mode": "NodeLocal", "nodeLocal": {"path": path}}}


def kv_tier(path: str) -> dict[str, Any]:
    return {"l2": {"fs": {"hostPath": {"path": path}}}}


def path_schemas() -> list[dict[str, Any]]:
    mc = build_crd(modelcache.CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    kv = build_crd(kvcachetier.CRD)["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return [
        mc["properties"]["storage"]["properties"]["nodeLocal"]["properties"]["path"],
        kv["properties"]["l2"]["properties"]["fs"]["properties"]["hostPath"]["properties"]["path"],
    ]


@pytest.mark.parametrize("path", SYSTEM_PATHS)
def test_system_directories_and_their_insides_are_refused(path: str) -> None:
    assert re.fullmatch(SYSTEM_DIRECTORY_PATTERN, path)
    with pytest.raises(ValidationError, match="must not be a system directory"):
        ModelCacheSpec.model_validate(model_cache(path))
    with pytest.raises(ValidationError, match="must not be a system directory"):
        KVCacheTierSpec.model_validate(kv_tier(path))


@pytest.mark.parametrize("path", UNCLEAN_PATHS)
def test_dot_segments_double_and_trailing_slashes_are_refused(path: str) -> None:
    with pytest.raises(ValidationError, match="clean absolute path"):
        ModelCacheSpec.model_validate(model_cache(path))
    with pytest.raises(ValidationError, match="clean absolute path"):
        KVCacheTierSpec.model_validate(kv_tier(path))


@pytest.mark.parametrize("path", ACCEPTED_PATHS)
def test_dedicated_directories_are_accepted(path: str) -> None:
    assert not re.fullmatch(SYSTEM_DIRECTORY_PATTERN, path) and not re.search(UNCLEAN_SEGMENT_PATTERN, path)
    ModelCacheSpec.model_validate(model_cache(path))
    KVCacheTierSpec.model_validate(kv_tier(path))


def test_both_host_paths_carry_the_rules_and_document_them() -> None:
    for schema in path_schemas():
        rules = " ".join(r["rule"] for r in schema["x-kubernetes-validations"])
        assert SYSTEM_DIRECTORY_PATTERN in rules and UNCLEAN_SEGMENT_PATTERN in rules
        assert schema["pattern"] == "^/" and schema["maxLength"] == 4096
        assert "Refused: system directories" in schema["description"] and "/var/lib/kubelet" in schema["description"]
