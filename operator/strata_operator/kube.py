"""Thin Kubernetes API helpers shared by the handlers: client, server-side apply, ownership labels."""

from __future__ import annotations

import datetime
import functools
import threading
from collections.abc import Mapping
from typing import Any

import kubernetes
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ApiException, NotFoundError

from strata_operator import settings

FIELD_MANAGER = "strata-operator"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
INSTANCE_LABEL = "app.kubernetes.io/instance"
COMPONENT_LABEL = "app.kubernetes.io/component"
MANAGED_BY = "strata"

_client_lock = threading.Lock()


@functools.cache
def _load_config() -> None:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        # The client reads $KUBECONFIG once at import time; read it now so a changed value is honoured.
        kubernetes.config.load_kube_config(config_file=settings.kubeconfig())


def dynamic_client() -> DynamicClient:
    """One dynamic client per process (discovery is cached by the client itself)."""
    with _client_lock:
        return _dynamic_client()


@functools.cache
def _dynamic_client() -> DynamicClient:
    _load_config()
    return DynamicClient(kubernetes.client.ApiClient())


def api_reachable(timeout: float) -> None:
    """Raise unless the API server answers `/version` within `timeout` seconds."""
    kubernetes.client.VersionApi(dynamic_client().client).get_code(_request_timeout=timeout)


def reset_clients() -> None:
    """Forget cached configuration (tests switch clusters between sessions)."""
    _load_config.cache_clear()
    _dynamic_client.cache_clear()


def owner_reference(owner: Mapping[str, Any]) -> dict[str, Any]:
    """A controller ownerReference so kube-controller-manager's garbage collector removes the child."""
    return {
        "apiVersion": owner["apiVersion"],
        "kind": owner["kind"],
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def child_labels(owner_name: str, component: str | None = None) -> dict[str, str]:
    labels = {MANAGED_BY_LABEL: MANAGED_BY, INSTANCE_LABEL: owner_name}
    if component:
        labels[COMPONENT_LABEL] = component
    return labels


def created_by_strata(live: Mapping[str, Any], owner_uid: str, owner_name: str, component: str) -> bool:
    """Whether Strata made this object for that owner: its ownerReference (the owner's uid), or, for a child
    kept without one (a claim under deletionPolicy Retain), Strata's managed-by, instance and component labels.

    Anything else of the same name belongs to someone else: applying over it (forced) would take it over, and the
    garbage collector would later delete it with the owner.
    """
    meta = live.get("metadata") or {}
    if any(ref.get("uid") == owner_uid for ref in meta.get("ownerReferences") or []):
        return True
    labels = meta.get("labels") or {}
    return (
        labels.get(MANAGED_BY_LABEL) == MANAGED_BY
        and labels.get(INSTANCE_LABEL) == owner_name
        and labels.get(COMPONENT_LABEL) == component
    )


def apply(body: Mapping[str, Any], *, namespace: str | None = None) -> Any:
    """Server-side apply with Strata's field manager; returns the object as stored.

    Forced, because the operator is the only intended owner of the fields it renders; fields other
    managers set (e.g. the Job controller's selectors) are left alone by server-side apply.
    """
    client = dynamic_client()
    resource = client.resources.get(api_version=body["apiVersion"], kind=body["kind"])
    ns = namespace or body.get("metadata", {}).get("namespace")
    return resource.server_side_apply(
        body=dict(body),
        name=body["metadata"]["name"],
        namespace=ns if resource.namespaced else None,
        field_manager=FIELD_MANAGER,
        force_conflicts=True,
    )


def get(api_version: str, kind: str, name: str, namespace: str | None = None) -> Any | None:
    """The object, or None when it does not exist."""
    resource = dynamic_client().resources.get(api_version=api_version, kind=kind)
    try:
        return resource.get(name=name, namespace=namespace if resource.namespaced else None)
    except NotFoundError:
        return None


def delete(api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
    """Delete in the background; True when something was deleted."""
    resource = dynamic_client().resources.get(api_version=api_version, kind=kind)
    try:
        resource.delete(
            name=name,
            namespace=namespace if resource.namespaced else None,
            body={"propagationPolicy": "Background"},
        )
    except NotFoundError:
        return False
    return True


def post_node_event(node: str, uid: str, type_: str, reason: str, message: str) -> bool:
    """An Event about a Node, where the kubelet puts them (namespace default, involvedObject without a
    namespace), so `kubectl describe node` shows it; kopf's events would name the object namespace default.
    False when it could not be posted (e.g. no permission for Events in default)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{node}.", "namespace": "default"},
        "involvedObject": {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid},
        "type": type_,
        "reason": reason,
        "message": message[:1024],
        "source": {"component": FIELD_MANAGER},
        "reportingComponent": FIELD_MANAGER,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        dynamic_client().resources.get(api_version="v1", kind="Event").create(body=body, namespace="default")
    except ApiException:
        return False
    return True
