"""Helpers for tests against the local control plane: waiting, namespaces, fake (kwok) nodes."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import kubernetes
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError

T = TypeVar("T")
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"


def wait_for(predicate: Callable[[], T], timeout: float = 60.0, interval: float = 0.25, what: str = "") -> T:
    """Poll until `predicate` returns something truthy; fail with `what` and the last value otherwise."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except NotFoundError:
            last = None
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what or predicate}: last value {last!r}")


def resource(client: DynamicClient, api_version: str, kind: str) -> Any:
    return client.resources.get(api_version=api_version, kind=kind)


def get_or_none(client: DynamicClient, api_version: str, kind: str, name: str, namespace: str | None) -> Any:
    try:
        return resource(client, api_version, kind).get(name=name, namespace=namespace)
    except NotFoundError:
        return None


def printed_row(client: DynamicClient, api_version: str, plural: str, namespace: str, name: str) -> dict[str, Any]:
    """`kubectl get`'s row for one object: the API server's Table rendering of its printer columns, by column."""
    table = client.request(
        "GET",
        f"/apis/{api_version}/namespaces/{namespace}/{plural}/{name}",
        header_params={"Accept": "application/json;as=Table;v=v1;g=meta.k8s.io"},
        serializer=lambda _client, data: data,
    )
    names = [c["name"] for c in table["columnDefinitions"]]
    return dict(zip(names, table["rows"][0]["cells"], strict=True))


def fake_node(
    name: str,
    *,
    labels: Mapping[str, str] | None = None,
    allocatable: Mapping[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """A Node that kwok manages (status heartbeats, Ready) — a stand-in for a kubelet, which cannot run here."""
    capacity = {"cpu": "32", "memory": "256Gi", "pods": "110", "nvidia.com/gpu": "8", **(allocatable or {})}
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {FAKE_NODE_ANNOTATION: "fake", "node.alpha.kubernetes.io/ttl": "0"},
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "type": "kwok",
                **(labels or {}),
            },
        },
        "spec": {"taints": taints or []},
        "status": {"allocatable": capacity, "capacity": capacity},
    }


def create_fake_node(client: DynamicClient, name: str, **kwargs: Any) -> Any:
    return resource(client, "v1", "Node").create(body=fake_node(name, **kwargs))


def delete_quietly(client: DynamicClient, api_version: str, kind: str, name: str, namespace: str | None) -> None:
    with contextlib.suppress(NotFoundError):
        resource(client, api_version, kind).delete(name=name, namespace=namespace)


def new_dynamic_client(kubeconfig: str) -> DynamicClient:
    api_client = kubernetes.config.new_client_from_config(config_file=kubeconfig)
    return DynamicClient(api_client)


def service_account_may(
    client: DynamicClient,
    namespace: str,
    account: str,
    verb: str,
    resource_name: str,
    *,
    group: str = "",
    name: str = "",
    where: str | None = None,
    subresource: str = "",
) -> bool:
    """The API server's own RBAC decision (a SubjectAccessReview) for service account `namespace/account` doing
    `verb` on `resource_name` (in namespace `where`, or cluster-wide; one object when `name` is given)."""
    attributes = {"verb": verb, "group": group, "resource": resource_name, "subresource": subresource, "name": name}
    if where:
        attributes["namespace"] = where
    return service_account_allowed(client, namespace, account, {"resourceAttributes": attributes})


def service_account_allowed(client: DynamicClient, namespace: str, account: str, attributes: Mapping[str, Any]) -> bool:
    """The API server's own RBAC decision for service account `namespace/account`, on a SubjectAccessReview spec's
    `resourceAttributes` or `nonResourceAttributes` as given."""
    review = resource(client, "authorization.k8s.io/v1", "SubjectAccessReview").create(
        body={
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "user": f"system:serviceaccount:{namespace}:{account}",
                "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
                **attributes,
            },
        }
    )
    return bool(review.status.allowed)


def delete_and_collect(
    client: DynamicClient, api_version: str, kind: str, name: str, namespace: str | None, timeout: float = 90
) -> None:
    """Delete an owner in the foreground and wait until it is gone.

    The garbage collector removes an owner deleted this way only after it has deleted every dependent whose
    ownerReference blocks owner deletion (Strata sets `blockOwnerDeletion` on all of its own), checking each
    against the live object. So the owner's absence is the positive signal that the collector has judged its
    dependents: a test that something outlived its former owner checks after it, never after a sleep.
    """
    resource(client, api_version, kind).delete(
        name=name,
        namespace=namespace,
        body={"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Foreground"},
    )
    wait_for(
        lambda: get_or_none(client, api_version, kind, name, namespace) is None,
        timeout=timeout,
        what=f"{kind} {name} deleted in the foreground",
    )
