"""The kvserver DaemonSet: one unprivileged server per selected node, rolled when its config changes."""

from __future__ import annotations

import copy
from typing import Any

from strata_kv.config import CONFIG_FILE_NAME

from strata_operator.api.kvcachetier import KVCacheTierSpec, UpdateStrategyType
from strata_operator.resources.kvcachetier.auth import token_secret
from strata_operator.resources.kvcachetier.config import hash_seed
from strata_operator.resources.kvcachetier.names import (
    AUTH_DIR,
    AUTH_FILE,
    CONFIG_DIR,
    CONFIG_HASH_ANNOTATION,
    EVENTS_PORT_NAME,
    L2_FS_ROOT,
    METRICS_PORT_NAME,
    RESP_PORT_NAME,
    TierRef,
    memory_quantity,
    quantity_bytes,
)
from strata_operator.resources.kvcachetier.node_socket import node_socket_mount, node_socket_volume
from strata_operator.resources.runtime_image import RuntimeImage
from strata_operator.resources.security import container_security_context, pod_security_context

"""The conventional nonroot uid/gid of distroless images; the runtime image runs as it."""
CPU_REQUEST = "250m"
"""The event loop's share when it sends every reply itself; with sender threads, one CPU per thread and the loop's."""
MEMORY_LIMIT_FACTOR = 1.25
"""The limit above the request: room for allocator slack so a full L1 is not OOM-killed."""
TERMINATION_GRACE_SECONDS = 45
"""Longer than the server's default 30 s write-behind drain."""


def derived_memory_request(spec: KVCacheTierSpec) -> int:
    """L1 plus headroom for the process and the write-behind queue, in bytes, plus what clients may hold of the
    memory handed over to them (charged to the server's cgroup) when it hands memory over."""
    shared = spec.node_socket.shared_memory_budget if spec.node_socket.enabled and spec.node_socket.shared_memory else 0
    return spec.l1.size + spec.memory_headroom + shared


def build_resources(spec: KVCacheTierSpec) -> dict[str, Any]:
    """The container's resources: the spec's override wins key by key; memory and CPU are derived where unset."""
    resources: dict[str, Any] = copy.deepcopy(spec.resources or {})
    requests = resources.setdefault("requests", {})
    limits = resources.setdefault("limits", {})
    request = memory_request_bytes(spec)
    if "memory" not in requests:
        requests["memory"] = limits.get("memory") or memory_quantity(request)
    if "memory" not in limits:
        limits["memory"] = memory_quantity(int(request * MEMORY_LIMIT_FACTOR))
    requests.setdefault("cpu", str(spec.sender_threads + 1) if spec.sender_threads else CPU_REQUEST)
    return resources


def memory_request_bytes(spec: KVCacheTierSpec) -> int:
    """What the scheduler must find free on a node for one server: the spec's memory request, else its limit
    (as Kubernetes defaults a request), else L1 plus headroom in whole Mi (as `memory_quantity` writes it).
    Only a quantity the user wrote is parsed; the derived one is never formatted and read back."""
    resources = spec.resources or {}
    requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
    if "memory" in requests:
        return quantity_bytes(requests["memory"])
    if limit := limits.get("memory"):
        return quantity_bytes(limit)
    return -(-derived_memory_request(spec) // 2**20) * 2**20


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": METRICS_PORT_NAME},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 2,
    }


def _volumes(spec: KVCacheTierSpec, tier: TierRef) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Volumes and their mounts: config (read-only), scratch /tmp, the auth token, the L2 filesystem, the node
    socket's directory."""
    volumes: list[dict[str, Any]] = [
        {"name": "config", "configMap": {"name": tier.config_map}},
        {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
    ]
    mounts: list[dict[str, Any]] = [
        {"name": "config", "mountPath": CONFIG_DIR, "readOnly": True},
        {"name": "tmp", "mountPath": "/tmp"},
    ]
    if (token := token_secret(spec, tier)) is not None:
        items = [{"key": token.key, "path": AUTH_FILE}]
        volumes.append({"name": "auth", "secret": {"secretName": token.name, "items": items, "defaultMode": 0o440}})
        mounts.append({"name": "auth", "mountPath": AUTH_DIR, "readOnly": True})
    fs = spec.l2.fs if spec.l2 else None
    if fs is not None:
        if fs.host_path is not None:
            # Directory, not DirectoryOrCreate: kubelet would create it owned by root, unwritable for the server.
            volumes.append({"name": "l2", "hostPath": {"path": fs.host_path.path, "type": "Directory"}})
        elif fs.pvc is not None:
            claim = fs.pvc.claim_name or tier.created_pvc
            volumes.append({"name": "l2", "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": "l2", "mountPath": L2_FS_ROOT})
    if spec.node_socket.enabled:
        volumes.append(node_socket_volume(spec, tier, read_only=False))
        mounts.append(node_socket_mount(read_only=False))
    return volumes, mounts


def _env(spec: KVCacheTierSpec, tier: TierRef) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    env: list[dict[str, Any]] = [
        {"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "PYTHONHASHSEED", "value": hash_seed(spec, tier)},
    ]
    env_from: list[dict[str, Any]] = []
    s3 = spec.l2.s3 if spec.l2 else None
    if s3 is not None and s3.secret_ref is not None:
        env_from.append({"secretRef": {"name": s3.secret_ref.name}})
    return env, env_from


def _container(
    spec: KVCacheTierSpec, tier: TierRef, mounts: list[dict[str, Any]], runtime: RuntimeImage
) -> dict[str, Any]:
    env, env_from = _env(spec, tier)
    container: dict[str, Any] = {
        "name": "kvserver",
        "image": spec.image or runtime.image,
        "command": ["strata-kv"],
        # The pod's own address, not every interface: the Service, the probes and the usage scrape all use it.
        "args": [
            "serve",
            "--config",
            f"{CONFIG_DIR}/{CONFIG_FILE_NAME}",
            "--bind",
            "$(POD_IP)",
            "--metrics-bind",
            "$(POD_IP)",
        ],
        "ports": [
            {"name": RESP_PORT_NAME, "containerPort": spec.port, "protocol": "TCP"},
            {"name": METRICS_PORT_NAME, "containerPort": spec.metrics_port, "protocol": "TCP"},
        ]
        + (
            [{"name": EVENTS_PORT_NAME, "containerPort": spec.events.port, "protocol": "TCP"}]
            if spec.events.enabled
            else []
        ),
        "env": env,
        "resources": build_resources(spec),
        "readinessProbe": _probe("/readyz", 5, 3),
        "livenessProbe": _probe("/healthz", 10, 6),
        "securityContext": container_security_context(),
        "volumeMounts": mounts,
    }
    policy = runtime.pull_policy_for(spec.image, spec.image_pull_policy.value if spec.image_pull_policy else None)
    if policy:
        container["imagePullPolicy"] = policy
    if env_from:
        container["envFrom"] = env_from
    return container


def _pod_spec(spec: KVCacheTierSpec, tier: TierRef, runtime: RuntimeImage) -> dict[str, Any]:
    volumes, mounts = _volumes(spec, tier)
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "securityContext": pod_security_context(),
        "containers": [_container(spec, tier, mounts, runtime)],
        "volumes": volumes,
    }
    if pull_secrets := runtime.pod_pull_secrets():
        pod["imagePullSecrets"] = pull_secrets
    if spec.node_selector:
        pod["nodeSelector"] = dict(spec.node_selector)
    if spec.tolerations:
        pod["tolerations"] = copy.deepcopy(spec.tolerations)
    if spec.affinity:
        pod["affinity"] = copy.deepcopy(spec.affinity)
    if spec.priority_class_name:
        pod["priorityClassName"] = spec.priority_class_name
    return pod


def _update_strategy(spec: KVCacheTierSpec) -> dict[str, Any]:
    strategy: dict[str, Any] = {"type": spec.update_strategy.type.value}
    if spec.update_strategy.type is UpdateStrategyType.ROLLING_UPDATE:
        max_unavailable = spec.update_strategy.max_unavailable
        strategy["rollingUpdate"] = {"maxUnavailable": 1 if max_unavailable is None else max_unavailable}
    return strategy


def build_daemonset(spec: KVCacheTierSpec, tier: TierRef, config_hash: str, runtime: RuntimeImage) -> dict[str, Any]:
    """The DaemonSet; `config_hash` goes on the pod template so a config change rolls every pod."""
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": tier.metadata(tier.daemonset),
        "spec": {
            "selector": {"matchLabels": tier.selector_labels()},
            "updateStrategy": _update_strategy(spec),
            "revisionHistoryLimit": 5,
            "template": {
                "metadata": {
                    "labels": tier.selector_labels(),
                    "annotations": {
                        CONFIG_HASH_ANNOTATION: config_hash,
                        "kubectl.kubernetes.io/default-container": "kvserver",
                    },
                },
                "spec": _pod_spec(spec, tier, runtime),
            },
        },
    }
