"""The node-local socket: one directory per (namespace, tier) on each node, published by a CSI driver into the
tier's server (read-write: it creates the socket) and into the serving pods the webhook wires (read-only:
connecting to a Unix socket needs no write access to its filesystem, and a read-only mount keeps clients from
replacing the socket or filling the directory). The driver grants read-write only to pods named as the tier's
DaemonSet (named after the tier, `TierRef.daemonset`) names its pods, and refuses it to any other.

Why CSI: `restricted` Pod Security allows ephemeral inline `csi` volumes but not hostPath or hostIPC, so a
small node plugin (the chart's `kvSocketDriver`) is the one way restricted pods on a node can share a directory.
The plugin takes the namespace from the pod it publishes for (`podInfoOnMount`), never from the volume's
attributes, so a pod can reach only its own namespace's tiers.
"""

from __future__ import annotations

from typing import Any

from strata_kv.csi.volume import TIER_ATTRIBUTE  # the volume attribute the driver pairs with the pod's namespace

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.security import RUNTIME_UID

NODE_SOCKET_DIR = "/run/strata-kv"
NODE_SOCKET_PATH = f"{NODE_SOCKET_DIR}/kv.sock"
NODE_SOCKET_VOLUME = "strata-kv-socket"
NODE_SOCKET_MODE = 0o660
"""Owner and group: the server (uid and gid RUNTIME_UID) and the pods the webhook gives that supplemental group."""
SOCKET_GROUP = RUNTIME_UID


def node_socket_volume(spec: KVCacheTierSpec, tier: TierRef, *, read_only: bool) -> dict[str, Any]:
    """The inline CSI volume for the tier's socket directory (`readOnly` only where true: the API server omits a
    false one, and what is stored must equal what is rendered)."""
    csi: dict[str, Any] = {"driver": spec.node_socket.driver, "volumeAttributes": {TIER_ATTRIBUTE: tier.name}}
    if read_only:
        csi["readOnly"] = True
    return {"name": NODE_SOCKET_VOLUME, "csi": csi}


def node_socket_mount(*, read_only: bool) -> dict[str, Any]:
    mount: dict[str, Any] = {"name": NODE_SOCKET_VOLUME, "mountPath": NODE_SOCKET_DIR}
    if read_only:
        mount["readOnly"] = True
    return mount
