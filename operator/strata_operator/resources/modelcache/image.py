"""ImageVolume: the oci:// reference resolved to a digest, and when to resolve it again.

Nodes must all serve the same bytes, so the tag is resolved once and every pod and pre-pull mounts
`registry/repository@sha256:...` (status.image.reference). The operator resolves again only when asked: the
annotation `strata.dev/resolve-image` set to a new value (e.g. a timestamp) follows a tag that moved. A failed
resolution is tried again with back-off (30 s doubling, at most 10 min), and at once on a spec change or a new
annotation value (a Secret fixed meanwhile is seen at the next attempt).

The lookup itself is a read made by gather (`handlers/modelcache/image_lookup.py`), whose answer arrives here as
an `ImageLookup`; everything else is decided here, on plain data.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strata_units import format_bytes

from strata_operator.api import GROUP
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.modelcache.nodes import NodeInfo
from strata_operator.resources.modelcache.storage import image_reference

RESOLVE_ANNOTATION = f"{GROUP}/resolve-image"
RETRY_BASE_SECONDS = 30
RETRY_MAX_SECONDS = 600
DEFAULT_PLATFORM = "linux/amd64"
ARCH_LABEL, OS_LABEL = "kubernetes.io/arch", "kubernetes.io/os"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"

REASONS = {
    "Denied": "ImagePullDenied",
    "NotFound": "ImageNotFound",
    "DigestMismatch": "ImageDigestMismatch",
    "NoPlatform": "ImagePlatformMissing",
    "Unreachable": "RegistryUnreachable",
    "Refused": "RegistryError",
    "Credentials": "ImagePullSecretInvalid",
    "Trust": "ImageCAInvalid",
}
"""The condition reason of each kind of failure (`strata_loader.registry` reasons, and the operator's own for a
pull Secret or CA bundle it cannot use)."""


@dataclass(frozen=True)
class ImageLookup:
    """What gather learnt from the registry: a resolution (digest and size) or why there is none."""

    resolved_from: str
    platform: str
    digest: str | None = None
    reference: str | None = None
    platform_digest: str | None = None
    size_bytes: int | None = None
    layers: int | None = None
    failure: str | None = None
    """A key of REASONS."""
    message: str | None = None
    transient: bool = False


def lookup_platform(nodes: Mapping[str, NodeInfo], selector: Mapping[str, str]) -> str:
    """The platform whose manifest a node pulls: that of the selected Ready nodes (the first by name), or
    linux/amd64 when none says."""
    for _, info in sorted(nodes.items()):
        if info.ready and info.matches(selector) and ARCH_LABEL in info.labels:
            return f"{info.labels.get(OS_LABEL, 'linux')}/{info.labels[ARCH_LABEL]}"
    return DEFAULT_PLATFORM


def lookup_due(
    spec: ModelCacheSpec,
    previous: Mapping[str, Any],
    request: str,
    generation: int | None,
    now: datetime.datetime,
) -> bool:
    """Whether gather asks the registry now: no pin for this reference and annotation value yet, or a failed
    attempt whose back-off ended (or whose spec or annotation changed since)."""
    image = previous.get("image") or {}
    same_ask = image.get("resolvedFrom") == image_reference(spec) and (image.get("resolveRequest") or "") == request
    if not same_ask:
        return True
    if image.get("digest") and not image.get("failures"):
        return False
    if previous.get("observedGeneration") != generation:
        return True
    retry = image.get("nextAttempt")
    return not retry or now >= datetime.datetime.strptime(retry, TIME_FORMAT).replace(tzinfo=datetime.UTC)


def image_status(
    previous: Mapping[str, Any], lookup: ImageLookup | None, request: str, now: datetime.datetime
) -> dict[str, Any]:
    """status.image after this reconcile: the previous pin when nothing was looked up, the new one on success;
    on failure the pin in force (if any) stays, with the failure and the next attempt's time."""
    before = dict(previous.get("image") or {})
    if lookup is None:
        return before
    if lookup.failure is None:
        return {
            "reference": lookup.reference,
            "digest": lookup.digest,
            "resolvedFrom": lookup.resolved_from,
            "resolvedAt": now.strftime(TIME_FORMAT),
            "resolveRequest": request or None,
            "platform": lookup.platform,
            "platformDigest": lookup.platform_digest,
            "sizeBytes": lookup.size_bytes,
            "layers": lookup.layers,
        }
    same_ask = before.get("resolvedFrom") == lookup.resolved_from
    failures = int(before.get("failures") or 0) + 1 if same_ask else 1
    delay = min(RETRY_MAX_SECONDS, RETRY_BASE_SECONDS * 2 ** (failures - 1))
    kept = {k: before.get(k) for k in ("reference", "digest", "resolvedAt", "platform", "platformDigest")}
    kept.update(sizeBytes=before.get("sizeBytes"), layers=before.get("layers"))
    return {
        **(kept if same_ask and before.get("digest") else {}),
        "resolvedFrom": lookup.resolved_from,
        "resolveRequest": request or None,
        "failures": failures,
        "nextAttempt": (now + datetime.timedelta(seconds=delay)).strftime(TIME_FORMAT),
        "reason": REASONS.get(lookup.failure, "RegistryError"),
        "message": f"resolving {lookup.resolved_from}: {lookup.message}",
        "transient": lookup.transient or None,  # kept until the next attempt: Reconciling while it waits
    }


def failure_of(lookup: ImageLookup | None) -> tuple[str, str] | None:
    """(condition reason, message) of a failed lookup made now."""
    if lookup is None or lookup.failure is None:
        return None
    return REASONS.get(lookup.failure, "RegistryError"), f"resolving {lookup.resolved_from}: {lookup.message}"


def size_fields(image: Mapping[str, Any]) -> dict[str, Any]:
    """totalBytes and the printer column's size from the resolved image."""
    size = image.get("sizeBytes")
    if size is None:
        return {}
    return {"totalBytes": size, "size": format_bytes(int(size), approximate=True)}
