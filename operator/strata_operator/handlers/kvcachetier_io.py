"""The few API reads and writes a KVCacheTier reconcile makes, returning plain dicts.

Lists skip the dynamic client's object wrapping (`serialize=False`): with hundreds of nodes and pods
that wrapping, not the API server, dominates the cost of a status update.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from kubernetes.dynamic.exceptions import ConflictError, NotFoundError

from strata_operator import kube
from strata_operator.api import API_VERSION

TIER_KIND = "KVCacheTier"


def _resource(api_version: str, kind: str) -> Any:
    return kube.dynamic_client().resources.get(api_version=api_version, kind=kind)


def read(api_version: str, kind: str, name: str, namespace: str | None) -> dict[str, Any] | None:
    """The object as a dict, or None when it does not exist."""
    resource = _resource(api_version, kind)
    try:
        response = resource.get(name=name, namespace=namespace if resource.namespaced else None, serialize=False)
    except NotFoundError:
        return None
    return dict(json.loads(response.data))


def list_objects(
    api_version: str, kind: str, *, namespace: str | None = None, label_selector: str | None = None
) -> list[dict[str, Any]]:
    resource = _resource(api_version, kind)
    response = resource.get(
        namespace=namespace if resource.namespaced else None, label_selector=label_selector, serialize=False
    )
    return list(json.loads(response.data).get("items") or [])


def apply(body: Mapping[str, Any]) -> dict[str, Any]:
    """Server-side apply with Strata's field manager; a no-op on the server when nothing changed."""
    return dict(kube.apply(body).to_dict())


def create(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Create the object; None when one of that name already exists (it is never overwritten)."""
    meta = body["metadata"]
    try:
        created = _resource(body["apiVersion"], body["kind"]).create(body=dict(body), namespace=meta.get("namespace"))
    except ConflictError:
        return None
    return dict(created.to_dict())


def read_tier(name: str, namespace: str) -> dict[str, Any] | None:
    return read(API_VERSION, TIER_KIND, name, namespace)


def write_tier_status(name: str, namespace: str, status: Mapping[str, Any]) -> None:
    """A merge patch of the status subresource (lists inside are replaced whole, as intended)."""
    _resource(API_VERSION, TIER_KIND).status.patch(
        body={"status": dict(status)},
        name=name,
        namespace=namespace,
        content_type="application/merge-patch+json",
    )
