"""Who is asking: before the plugin publishes anything it reads, from the API server, the pod the kubelet names
and the KVCacheTier the volume names, and for a writable volume the chain of controllers from the pod to the tier.

A pod's name is the pod author's to choose (a tenant can call a pod `kv-ttrn7`), so it proves nothing. What the
plugin checks instead:

- the pod: the one the kubelet mounts for (its uid, which the kubelet passes with `podInfoOnMount`, is the live
  pod's), and bound to this node;
- the tier: a KVCacheTier of that name exists in the pod's namespace and serves a node socket
  (`spec.nodeSocket.enabled`), so no directory is made for a tier that does not exist;
- a writable volume (the server's): the pod's controller is the DaemonSet the operator made for that tier
  (the live DaemonSet's uid, named after the tier, its own controller the live KVCacheTier by uid, with Strata's
  labels), the pod carries that DaemonSet's selector labels, so the DaemonSet controller counts it as one
  of its own, and every container that mounts the volume is the template's (image, command, args, env,
  mounts): an ownerReference is the pod author's to write, the code that runs with the directory is not.

The checks are pure functions of the objects read (`check_*`), so they are unit-tested without a cluster.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .kubeapi import KubeAPI
from .volume import DRIVER_NAME, NodeDirectory

TIER_API_VERSION = "strata.dev/v1alpha1"
TIER_KIND = "KVCacheTier"
MANAGED_BY = ("app.kubernetes.io/managed-by", "strata")
INSTANCE_LABEL = "app.kubernetes.io/instance"


class NotAdmitted(PermissionError):
    """The pod may not have this volume (the gRPC answer is PERMISSION_DENIED); the message says why."""


class TierMissing(LookupError):
    """The volume names a KVCacheTier that does not exist or serves no socket (the gRPC answer is NOT_FOUND)."""


def _meta(obj: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def controller_of(obj: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """The ownerReference with `controller: true`, if any (there is at most one)."""
    for ref in _meta(obj).get("ownerReferences") or []:
        if isinstance(ref, Mapping) and ref.get("controller") is True:
            return ref
    return None


def check_pod(pod: Mapping[str, Any] | None, wanted: NodeDirectory, node: str) -> None:
    """The pod the kubelet names is live, is the same pod (uid), and is bound to this node."""
    where = f"{wanted.namespace}/{wanted.pod}"
    if pod is None:
        raise NotAdmitted(f"pod {where} does not exist in the API server; the plugin publishes only for live pods")
    uid = _meta(pod).get("uid")
    if not wanted.pod_uid or uid != wanted.pod_uid:
        raise NotAdmitted(
            f"pod {where} has uid {uid}, not {wanted.pod_uid or '(none given)'}: not the pod the kubelet mounts for"
        )
    bound = (pod.get("spec") or {}).get("nodeName")
    if bound != node:
        raise NotAdmitted(f"pod {where} is bound to node {bound!r}, not this one ({node})")


def check_tier(tier: Mapping[str, Any] | None, wanted: NodeDirectory) -> None:
    where = f"{wanted.namespace}/{wanted.tier}"
    if tier is None:
        raise TierMissing(
            f"tier: KVCacheTier {where} does not exist; the plugin publishes a directory only for an existing "
            "tier of the pod's namespace (create it, or fix volumeAttributes.tier)"
        )
    node_socket = (tier.get("spec") or {}).get("nodeSocket") or {}
    if node_socket.get("enabled") is not True:
        raise TierMissing(f"tier: KVCacheTier {where} does not serve a node socket (set spec.nodeSocket.enabled)")
    if node_socket.get("driver", DRIVER_NAME) != DRIVER_NAME:
        raise TierMissing(
            f"tier: KVCacheTier {where} serves its socket through {node_socket['driver']}, not {DRIVER_NAME}"
        )


def check_server(
    pod: Mapping[str, Any],
    daemonset: Mapping[str, Any] | None,
    tier: Mapping[str, Any],
    wanted: NodeDirectory,
) -> None:
    """The pod is one of the tier's KV server pods: controlled by the DaemonSet the tier controls."""
    where = f"pod {wanted.namespace}/{wanted.pod}"
    hint = (
        f"readOnly: false is only for KVCacheTier {wanted.tier}'s server pods (created by the DaemonSet the "
        "operator runs for it); set readOnly: true on the csi volume (connecting to the socket needs no write access)"
    )
    ref = controller_of(pod)
    if ref is None or ref.get("apiVersion") != "apps/v1" or ref.get("kind") != "DaemonSet":
        raise NotAdmitted(f"{hint}: {where} is not controlled by a DaemonSet")
    if ref.get("name") != wanted.tier:
        raise NotAdmitted(f"{hint}: {where} is controlled by DaemonSet {ref.get('name')}, not {wanted.tier}")
    if daemonset is None or _meta(daemonset).get("uid") != ref.get("uid"):
        raise NotAdmitted(f"{hint}: {where} names a DaemonSet {wanted.tier} (uid {ref.get('uid')}) that is not live")
    ds_ref = controller_of(daemonset)
    tier_uid = _meta(tier).get("uid")
    if (
        ds_ref is None
        or ds_ref.get("apiVersion") != TIER_API_VERSION
        or ds_ref.get("kind") != TIER_KIND
        or ds_ref.get("name") != wanted.tier
        or ds_ref.get("uid") != tier_uid
    ):
        raise NotAdmitted(f"{hint}: DaemonSet {wanted.tier} is not controlled by KVCacheTier {wanted.tier}")
    labels = _meta(daemonset).get("labels") or {}
    if labels.get(MANAGED_BY[0]) != MANAGED_BY[1] or labels.get(INSTANCE_LABEL) != wanted.tier:
        raise NotAdmitted(f"{hint}: DaemonSet {wanted.tier} does not carry Strata's labels for the tier")
    selector = ((daemonset.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
    pod_labels = _meta(pod).get("labels") or {}
    if not selector or any(pod_labels.get(k) != v for k, v in selector.items()):
        raise NotAdmitted(f"{hint}: {where} does not carry DaemonSet {wanted.tier}'s selector labels")
    template = (((daemonset.get("spec") or {}).get("template")) or {}).get("spec") or {}
    differs = template_difference(pod.get("spec") or {}, template)
    if differs:
        raise NotAdmitted(
            f"{hint}: {where} differs from DaemonSet {wanted.tier}'s pod template ({differs}); a pod from an "
            "older template is replaced by the DaemonSet's rollout (or delete it)"
        )


CONTAINER_FIELDS = ("image", "command", "args", "env", "envFrom", "volumeMounts", "workingDir")
"""What decides what a container runs and sees: a pod with the server's ownerReference but its own code would
otherwise get the directory writable (an ownerReference is the pod author's to write)."""
PROCESS_SHARING = ("shareProcessNamespace", "hostPID", "hostIPC")
"""A container without the volume still reaches it through a shared process namespace (/proc/<pid>/root)."""


def template_difference(pod: Mapping[str, Any], template: Mapping[str, Any]) -> str:
    """Where the pod's spec differs from its DaemonSet's template in what reaches the tier's volume: each
    container that mounts a `kv.strata.dev` volume (init containers included) must be the template's container
    of that name, field by field, those volumes the template's, and no process sharing the template lacks.
    Other containers (a service mesh's sidecar) and fields admission may set (resources) are not compared.
    An empty string when it does not differ."""
    volumes = {v.get("name"): v for v in template.get("volumes") or [] if isinstance(v, Mapping)}
    csi = {n for n, v in volumes.items() if (v.get("csi") or {}).get("driver") == DRIVER_NAME}
    pod_volumes = {v.get("name"): v for v in pod.get("volumes") or [] if isinstance(v, Mapping)}
    pod_csi = {n for n, v in pod_volumes.items() if (v.get("csi") or {}).get("driver") == DRIVER_NAME}
    if pod_csi != csi or any(pod_volumes[n] != volumes[n] for n in csi):
        return f"its {DRIVER_NAME} volumes"
    for field in PROCESS_SHARING:
        if bool(pod.get(field)) and not bool(template.get(field)):
            return field
    for kind in ("initContainers", "containers"):
        theirs = {c.get("name"): c for c in template.get(kind) or [] if isinstance(c, Mapping)}
        for container in pod.get(kind) or []:
            mounts = {m.get("name") for m in container.get("volumeMounts") or [] if isinstance(m, Mapping)}
            if not mounts & csi:
                continue
            expected = theirs.get(container.get("name"))
            if expected is None:
                return f"{kind} {container.get('name')} is not in the template"
            for field in CONTAINER_FIELDS:
                if container.get(field) != expected.get(field):
                    return f"{kind} {container.get('name')}: {field}"
    return ""


def admit(api: KubeAPI, wanted: NodeDirectory, node: str, *, writable: bool) -> None:
    """Every check for one publish, in the order that reads least: NotAdmitted, TierMissing or an APIError."""
    pod = api.pod(wanted.namespace, wanted.pod)
    check_pod(pod, wanted, node)
    assert pod is not None
    tier = api.kv_cache_tier(wanted.namespace, wanted.tier)
    check_tier(tier, wanted)
    assert tier is not None
    if writable:
        check_server(pod, api.daemonset(wanted.namespace, wanted.tier), tier, wanted)
