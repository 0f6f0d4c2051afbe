"""What a publish request may ask for, decided without touching the filesystem: which node directory a pod gets.

The kubelet fills `csi.storage.k8s.io/*` keys of the volume context itself (the CSIDriver's
`podInfoOnMount: true`); a pod's author writes only the inline volume's `volumeAttributes`. So the namespace
comes from the kubelet's key and nothing else, the tier is the one attribute an author may set, and any other
key is refused: a `namespace` attribute that was silently ignored would look like it worked.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import PurePosixPath

DRIVER_NAME = "kv.strata.dev"
TIER_ATTRIBUTE = "tier"
POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
POD_NAME = "csi.storage.k8s.io/pod.name"
POD_UID = "csi.storage.k8s.io/pod.uid"
EPHEMERAL = "csi.storage.k8s.io/ephemeral"
KUBELET_PREFIX = "csi.storage.k8s.io/"
# Namespaces and KVCacheTier names are both DNS-1123 labels; a label can never be "." or ".." or hold a "/".
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # fullmatch: `$` would let "kv\n" through
DNS1123_LABEL_MAX = 63
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]*[a-z0-9])?")  # a pod's name
DNS1123_SUBDOMAIN_MAX = 253


class VolumeRequestError(ValueError):
    """A request the plugin refuses; `attribute` names what to change (the gRPC answer is INVALID_ARGUMENT)."""

    def __init__(self, attribute: str, message: str) -> None:
        super().__init__(f"{attribute}: {message}")
        self.attribute = attribute


@dataclass(frozen=True)
class NodeDirectory:
    """The node directory one KVCacheTier's pods in one namespace share: `<state-dir>/<namespace>/<tier>`."""

    namespace: str
    tier: str
    pod: str = ""
    """The pod's name, as the kubelet passes it."""
    pod_uid: str = ""
    """The pod's uid, as the kubelet passes it: the API server must know the pod by both (identity.py)."""

    def path(self, state_dir: str) -> str:
        return os.path.join(state_dir, self.namespace, self.tier)


def _label(attribute: str, value: str, what: str) -> str:
    if not value:
        raise VolumeRequestError(attribute, f"is empty; set it to the {what} (a DNS-1123 label)")
    if len(value) > DNS1123_LABEL_MAX:
        raise VolumeRequestError(
            attribute, f"is {len(value)} characters; a {what} is a DNS-1123 label of at most {DNS1123_LABEL_MAX}"
        )
    if not _DNS1123_LABEL.fullmatch(value):
        raise VolumeRequestError(
            attribute,
            f"{value!r} is not a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a "
            f"letter or digit); set it to the {what}",
        )
    return value


def node_directory(volume_context: dict[str, str]) -> NodeDirectory:
    """The directory a publish request gets, or a VolumeRequestError naming the attribute to fix."""
    unknown = sorted(k for k in volume_context if k != TIER_ATTRIBUTE and not k.startswith(KUBELET_PREFIX))
    if unknown:
        raise VolumeRequestError(
            unknown[0],
            f"unknown volume attribute (of {', '.join(unknown)}); {DRIVER_NAME} takes only {TIER_ATTRIBUTE!r} — "
            "the namespace is always the pod's own",
        )
    namespace = volume_context.get(POD_NAMESPACE)
    if namespace is None:
        raise VolumeRequestError(
            POD_NAMESPACE,
            f"missing: the kubelet sets it only when the CSIDriver {DRIVER_NAME} has podInfoOnMount: true",
        )
    if volume_context.get(EPHEMERAL, "false") != "true":
        raise VolumeRequestError(
            EPHEMERAL,
            f"{DRIVER_NAME} serves only inline ephemeral volumes (a pod's `csi` volume), not PersistentVolumes",
        )
    if TIER_ATTRIBUTE not in volume_context:
        raise VolumeRequestError(TIER_ATTRIBUTE, "missing; set volumeAttributes.tier to the KVCacheTier's name")
    for key in (POD_NAME, POD_UID):
        if not volume_context.get(key):
            raise VolumeRequestError(key, "missing: the kubelet sets it when the CSIDriver has podInfoOnMount: true")
    pod = volume_context[POD_NAME]
    if len(pod) > DNS1123_SUBDOMAIN_MAX or not _DNS1123_SUBDOMAIN.fullmatch(pod):
        raise VolumeRequestError(POD_NAME, f"{pod[:80]!r} is not a pod's name")
    return NodeDirectory(
        namespace=_label(POD_NAMESPACE, namespace, "pod's namespace"),
        tier=_label(TIER_ATTRIBUTE, volume_context[TIER_ATTRIBUTE], "KVCacheTier's name"),
        pod=pod,
        pod_uid=volume_context[POD_UID],
    )


def check_target_path(target_path: str, kubelet_dir: str) -> str:
    """The target the kubelet asks for, relative to `<kubelet-dir>/pods/`; only a normalised path below it is
    accepted. Textual only: the plugin then opens it below the pods directory without following any link
    (fspath.py), so its root privileges never mount anything over a path elsewhere on the node."""
    if not target_path:
        raise VolumeRequestError("target_path", "is empty")
    if not os.path.isabs(target_path):
        raise VolumeRequestError("target_path", f"{target_path!r} is not absolute")
    normal = os.path.normpath(target_path)
    pods = PurePosixPath(os.path.normpath(kubelet_dir)) / "pods"
    if normal != target_path.rstrip("/") or not PurePosixPath(normal).is_relative_to(pods) or normal == str(pods):
        raise VolumeRequestError(
            "target_path", f"{target_path!r} is not a normalised path under {pods} (the kubelet's pod volumes)"
        )
    return str(PurePosixPath(normal).relative_to(pods))
