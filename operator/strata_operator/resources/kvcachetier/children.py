"""Every child of a KVCacheTier, in the order they are applied (what the DaemonSet mounts comes first)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.core import stable_hash
from strata_operator.resources.kvcachetier.auth import token_secret
from strata_operator.resources.kvcachetier.config import build_config_map, config_hash
from strata_operator.resources.kvcachetier.connection import build_connection_config_map
from strata_operator.resources.kvcachetier.daemonset import build_daemonset
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.service import build_service
from strata_operator.resources.kvcachetier.storage import build_pvc
from strata_operator.resources.runtime_image import RuntimeImage


@dataclass(frozen=True)
class Children:
    config_map: dict[str, Any]
    connection: dict[str, Any]
    service: dict[str, Any]
    daemonset: dict[str, Any]
    pvc: dict[str, Any] | None
    config_hash: str

    def in_apply_order(self) -> list[dict[str, Any]]:
        ordered = [self.pvc] if self.pvc else []
        return [*ordered, self.config_map, self.connection, self.service, self.daemonset]


def build_children(
    spec: KVCacheTierSpec, tier: TierRef, runtime: RuntimeImage, *, token_version: str | None = None
) -> Children:
    """`token_version`: the generated token Secret's uid; a new token is new configuration (rolls the pods)."""
    config_map = build_config_map(spec, tier)
    digest = config_hash(config_map)
    if token_version:
        digest = stable_hash([digest, token_version], length=16)
    return Children(
        config_map=config_map,
        connection=build_connection_config_map(spec, tier),
        service=build_service(spec, tier),
        daemonset=build_daemonset(spec, tier, digest, runtime),
        pvc=build_pvc(spec, tier),
        config_hash=digest,
    )


def child_names(spec: KVCacheTierSpec, tier: TierRef) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every object the tier creates under its own names, the token Secret included:
    gather reads each, so the plan can tell a child of its own from someone else's object of that name."""
    names = [("v1", "PersistentVolumeClaim", tier.created_pvc)] if build_pvc(spec, tier) is not None else []
    names += [
        ("v1", "ConfigMap", tier.config_map),
        ("v1", "ConfigMap", tier.connection_config_map),
        ("v1", "Service", tier.service),
        ("apps/v1", "DaemonSet", tier.daemonset),
    ]
    token = token_secret(spec, tier)
    if token is not None and token.generated:
        names.append(("v1", "Secret", token.name))
    return names
