"""The Service vLLM pods dial: `internalTrafficPolicy: Local` keeps every request on the caller's node."""

from __future__ import annotations

from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.names import EVENTS_PORT_NAME, METRICS_PORT_NAME, RESP_PORT_NAME, TierRef


def build_service(spec: KVCacheTierSpec, tier: TierRef) -> dict[str, Any]:
    """A ClusterIP Service whose traffic never leaves the node (no kvserver there: connection refused)."""
    ports: list[dict[str, Any]] = [
        {"name": RESP_PORT_NAME, "port": spec.port, "targetPort": RESP_PORT_NAME, "protocol": "TCP"},
        {"name": METRICS_PORT_NAME, "port": spec.metrics_port, "targetPort": METRICS_PORT_NAME, "protocol": "TCP"},
    ]
    if spec.events.enabled:  # a subscriber on the node reaches its own node's publisher
        ports.append(
            {"name": EVENTS_PORT_NAME, "port": spec.events.port, "targetPort": EVENTS_PORT_NAME, "protocol": "TCP"}
        )
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": tier.metadata(tier.service),
        "spec": {
            "type": "ClusterIP",
            "internalTrafficPolicy": "Local",
            "selector": tier.selector_labels(),
            "ports": ports,
        },
    }


def events_url(spec: KVCacheTierSpec, tier: TierRef) -> str | None:
    """The node-local Service's KV event endpoint (a subscriber on the node reaches its own node's server)."""
    return f"tcp://{service_host(tier)}:{spec.events.port}" if spec.events.enabled else None


def service_host(tier: TierRef) -> str:
    """The Service's DNS name, without the cluster domain (resolved through the pod's search path)."""
    return f"{tier.service}.{tier.namespace}.svc"
