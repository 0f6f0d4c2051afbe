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
EPHEMERAL = "csi.storage.k8s.io/ephemeral"
KUBELET_PREFIX = "csi.storage.k8s.io/"
# Namespaces and KVCacheTier names are both DNS-1123 labels; a label can never be "." or ".." or hold a "/".
_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")  # fullmatch: `$` would let "kv\n" through
DNS1123_LABEL_MAX = 63
# How the DaemonSet controller names its pods: `<daemonset>-` cut to 58 characters, then 5 random characters
# of this alphabet (the API server's name generator). The operator names a tier's DaemonSet after the tier.
GENERATED_SUFFIX = "[bcdfghjklmnpqrstvwxz2456789]{5}"
GENERATED_BASE_MAX = DNS1123_LABEL_MAX - 5


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

    @property
    def server_pod_prefix(self) -> str:
        """What the tier's server pods' names start with (its DaemonSet's generated names)."""
        return f"{self.tier}-"[:GENERATED_BASE_MAX]

    @property
    def from_server(self) -> bool:
        """Whether the pod is named as the tier's DaemonSet names its KV server pods: only those get the
        directory writable (see the README for what this does and does not prove)."""
        return re.fullmatch(re.escape(self.server_pod_prefix) + GENERATED_SUFFIX, self.pod) is not None

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
    return NodeDirectory(
        namespace=_label(POD_NAMESPACE, namespace, "pod's namespace"),
        tier=_label(TIER_ATTRIBUTE, volume_context[TIER_ATTRIBUTE], "KVCacheTier's name"),
        pod=volume_context.get(POD_NAME, ""),
    )


def check_target_path(target_path: str, kubelet_dir: str) -> str:
    """The target the kubelet asks for, normalised; only a directory under `<kubelet-dir>/pods/` is accepted, so
    the plugin's root privileges never mount anything over a path elsewhere on the node."""
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
    return normal
