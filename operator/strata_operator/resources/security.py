"""The security settings every pod the operator renders carries: the `restricted` Pod Security Standard.

One place, so a preloader Job and a KV server can never drift apart; the chart's tests admit every
rendered pod into a namespace that enforces `restricted`.
"""

from __future__ import annotations

from typing import Any

RUNTIME_UID = 65532
"""The non-root user the runtime image is built with (images/runtime/Dockerfile)."""


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUNTIME_UID,
        "runAsGroup": RUNTIME_UID,
        "fsGroup": RUNTIME_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    return {
        "allowPrivilegeEscalation": False,
        "privileged": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
