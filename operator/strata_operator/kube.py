"""Thin Kubernetes API helpers shared by the handlers: the client, server-side apply, get, delete, node Events.
(Ownership labels and references are pure, in `resources/core.py`.)"""

from __future__ import annotations

import datetime
import functools
import json
import threading
from collections.abc import Mapping
from typing import Any

import kubernetes
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ApiException, NotFoundError

from strata_operator import settings

FIELD_MANAGER = "strata-operator"

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


def api_error_message(error: ApiException) -> str:
    """The API server's own message (what a person would see from kubectl), not the client's repr."""
    try:
        return str(json.loads(error.body).get("message") or error.reason)
    except (TypeError, ValueError, AttributeError):
        return str(getattr(error, "reason", error))


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
