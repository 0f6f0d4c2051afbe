"""The Service vLLM pods dial: `internalTrafficPolicy: Local` keeps every request on the caller's node."""

from __future__ import annotations

from typing import Any

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.names import METRICS_PORT_NAME, RESP_PORT_NAME, TierRef


def build_service(spec: KVCacheTierSpec, tier: TierRef) -> dict[str, Any]:
    """A ClusterIP Service whose traffic never leaves the node (no kvserver there: connection refused)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": tier.metadata(tier.service),
        "spec": {
            "type": "ClusterIP",
            "internalTrafficPolicy": "Local",
            "selector": tier.selector_labels(),
            "ports": [
                {"name": RESP_PORT_NAME, "port": spec.port, "targetPort": RESP_PORT_NAME, "protocol": "TCP"},
                {
                    "name": METRICS_PORT_NAME,
                    "port": spec.metrics_port,
                    "targetPort": METRICS_PORT_NAME,
                    "protocol": "TCP",
                },
            ],
        },
    }


def service_host(tier: TierRef) -> str:
    """The Service's DNS name, without the cluster domain (resolved through the pod's search path)."""
    return f"{tier.service}.{tier.namespace}.svc"
