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
from kubernetes.dynamic.exceptions import ApiException, ConflictError, NotFoundError

from strata_operator import settings

FIELD_MANAGER = "strata-operator"

_client_lock = threading.Lock()


@functools.cache
def _load_config() -> None:
    try:
        kubernetes.config.load_incluster_config()
    except kubernetes.config.ConfigException:
        # The client reads $KUBECONFIG once at import time; read it now so a changed value is honoured.
        kubernetes.config.load_kube_config(config_file=settings.Settings.from_env().kubeconfig)


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


_discovery_lock = threading.Lock()


def resource(api_version: str, kind: str) -> Any:
    """The dynamic client's handle for a kind. Discovery fills a cache the client does not guard: reconciles
    of both kinds run in worker threads, and two threads discovering at once fail (KeyError 'resources')."""
    with _discovery_lock:
        return dynamic_client().resources.get(api_version=api_version, kind=kind)


def apply(body: Mapping[str, Any], *, namespace: str | None = None) -> dict[str, Any]:
    """Server-side apply with Strata's field manager; returns the object as stored (a no-op on the server when
    nothing changed).

    Forced, because the operator is the only intended owner of the fields it renders; fields other
    managers set (e.g. the Job controller's selectors) are left alone by server-side apply.
    """
    handle = resource(body["apiVersion"], body["kind"])
    ns = namespace or body.get("metadata", {}).get("namespace")
    stored = handle.server_side_apply(
        body=dict(body),
        name=body["metadata"]["name"],
        namespace=ns if handle.namespaced else None,
        field_manager=FIELD_MANAGER,
        force_conflicts=True,
    )
    return dict(stored.to_dict())


def create(body: Mapping[str, Any]) -> dict[str, Any] | None:
    """Create the object; None when one of that name already exists (it is never overwritten)."""
    meta = body["metadata"]
    try:
        created = resource(body["apiVersion"], body["kind"]).create(body=dict(body), namespace=meta.get("namespace"))
    except ConflictError:
        return None
    return dict(created.to_dict())


def read(api_version: str, kind: str, name: str, namespace: str | None = None) -> dict[str, Any] | None:
    """The object as a dict, or None when it does not exist. Lists and reads skip the dynamic client's object
    wrapping (`serialize=False`): with hundreds of nodes and pods that wrapping, not the API server, dominates."""
    handle = resource(api_version, kind)
    try:
        response = handle.get(name=name, namespace=namespace if handle.namespaced else None, serialize=False)
    except NotFoundError:
        return None
    return dict(json.loads(response.data))


def list_objects(
    api_version: str,
    kind: str,
    *,
    namespace: str | None = None,
    label_selector: str | None = None,
    limit: int | None = None,
) -> list[dict[str, Any]]:
    """The objects (with `limit`, only the first page of that many)."""
    handle = resource(api_version, kind)
    response = handle.get(
        namespace=namespace if handle.namespaced else None,
        label_selector=label_selector,
        limit=limit,
        serialize=False,
    )
    return list(json.loads(response.data).get("items") or [])


POD_LOG_TIMEOUT_SECONDS = 10.0
"""The API server fetches a log from the pod's kubelet: an unreachable one must not hold a reconcile for long."""


def pod_log(namespace: str, name: str, container: str, *, tail_lines: int, limit_bytes: int) -> str:
    """The last `tail_lines` lines of a container's log, at most `limit_bytes` of them (the API server counts the
    limit from the first of those lines)."""
    core = kubernetes.client.CoreV1Api(dynamic_client().client)
    # The raw bytes: left to deserialize the answer, the client parses a log that is one JSON document and returns
    # the repr of the Python object (single quotes), which is no longer the JSON the container printed.
    response = core.read_namespaced_pod_log(
        name,
        namespace,
        container=container,
        tail_lines=tail_lines,
        limit_bytes=limit_bytes,
        _request_timeout=POD_LOG_TIMEOUT_SECONDS,
        _preload_content=False,
    )
    return bytes(response.data).decode(errors="replace")


def merge_patch(api_version: str, kind: str, name: str, namespace: str | None, body: Mapping[str, Any]) -> Any:
    """A JSON merge patch (None deletes a key): what label and annotation edits need, unlike apply, which
    would drop the keys other owners set."""
    handle = resource(api_version, kind)
    return handle.patch(
        name=name,
        namespace=namespace if handle.namespaced else None,
        body=dict(body),
        content_type="application/merge-patch+json",
    )


def json_patch(api_version: str, kind: str, name: str, namespace: str | None, ops: list[dict[str, Any]]) -> Any:
    """A JSON patch: list members by index, and `test` ops that make a concurrent change fail (422/409), not vanish."""
    handle = resource(api_version, kind)
    return handle.patch(
        name=name,
        namespace=namespace if handle.namespaced else None,
        body=ops,
        content_type="application/json-patch+json",
    )


class Conflict(Exception):
    """A conditional write found the object changed since the version it was read at (HTTP 409)."""


def patch_status(
    api_version: str,
    kind: str,
    name: str,
    namespace: str,
    status: Mapping[str, Any],
    resource_version: str | None = None,
) -> bool:
    """A merge patch of the status subresource (lists inside are replaced whole, as intended); False when the
    object is gone meanwhile (nothing left to report on). With `resource_version`, only onto that version:
    `Conflict` when another writer got there first."""
    body: dict[str, Any] = {"status": dict(status)}
    if resource_version is not None:
        body["metadata"] = {"resourceVersion": resource_version}
    try:
        resource(api_version, kind).status.patch(
            body=body,
            name=name,
            namespace=namespace,
            content_type="application/merge-patch+json",
        )
    except NotFoundError:
        return False
    except ConflictError as error:
        raise Conflict(f"{kind} {namespace}/{name} changed since version {resource_version}") from error
    return True


def delete(api_version: str, kind: str, name: str, namespace: str | None = None, uid: str | None = None) -> bool:
    """Delete in the background; True when something was deleted. With `uid`, only that object: one re-created
    under the same name meanwhile is left alone (409, False)."""
    handle = resource(api_version, kind)
    body: dict[str, Any] = {"propagationPolicy": "Background"}
    if uid is not None:
        body["preconditions"] = {"uid": uid}
    try:
        handle.delete(name=name, namespace=namespace if handle.namespaced else None, body=body)
    except NotFoundError:
        return False
    except ApiException as error:
        if uid is not None and error.status == 409:
            return False
        raise
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
        resource("v1", "Event").create(body=body, namespace="default")
    except ApiException:
        return False
    return True
