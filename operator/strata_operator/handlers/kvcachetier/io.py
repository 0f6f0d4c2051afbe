"""The KVCacheTier's own reads and writes (the generic ones are `strata_operator.kube`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strata_operator import kube
from strata_operator.api import API_VERSION

TIER_KIND = "KVCacheTier"


def read_tier(name: str, namespace: str) -> dict[str, Any] | None:
    return kube.read(API_VERSION, TIER_KIND, name, namespace)


def write_tier_status(name: str, namespace: str, status: Mapping[str, Any]) -> None:
    kube.patch_status(API_VERSION, TIER_KIND, name, namespace, status)
