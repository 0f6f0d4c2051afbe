"""The builders of fan-out's children (`fanout.py` decides when they exist): a cache's peer DaemonSet, its
headless Service and NetworkPolicy, the peers' token Secret, and the fetch request of a node that reads from
the peers. Pure, like every builder."""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

from strata_loader import contract

from strata_operator.api import GROUP
from strata_operator.api.modelcache import ModelCacheSpec
from strata_operator.resources.core import GeneratedToken
from strata_operator.resources.modelcache import names, storage
from strata_operator.resources.modelcache.jobs import NODE_ROOT_MOUNT, PodMounts, runtime_image
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.runtime_image import RuntimeImage
from strata_operator.resources.security import container_security_context, pod_security_context

ROLE_PEER = "peer"
TOKEN_KEY = "token"
TOKEN_MOUNT = "/strata/peer"
PAUSED_SELECTOR = {f"{GROUP}/fan-out": "done"}
"""A node label Strata never sets: a DaemonSet selecting it runs on no node."""
PEER_RESOURCES = {"requests": {"cpu": "100m", "memory": "64Mi"}, "limits": {"memory": "256Mi"}}
"""The peer sends files with sendfile from the page cache: little CPU and memory of its own."""
Adjust = Callable[[contract.FetchRequest, PodMounts], contract.FetchRequest]
"""How a node's fetch request and pod mounts change for the way it reads (`as_seed`, `from_peers`)."""


def peer_name(owner: CacheRef) -> str:
    """The DaemonSet, Service and NetworkPolicy of a cache's peers share one name."""
    return names.bounded_name(owner.name, "peer")


def token_secret_name(owner: CacheRef) -> str:
    return names.bounded_name(owner.name, "peer-token", limit=253)


def peer_url(owner: CacheRef) -> str:
    return f"http://{peer_name(owner)}.{owner.namespace}.svc:{contract.PEER_PORT}"


def _peer_selector(owner: CacheRef) -> dict[str, str]:
    return {names.CACHE_LABEL: owner.name, names.ROLE_LABEL: ROLE_PEER}


def build_peer_daemonset(
    owner: CacheRef, spec: ModelCacheSpec, runtime: RuntimeImage, *, paused: bool
) -> dict[str, Any]:
    """`serve-peer` on every node whose copy is Ready (none when `paused`), reading the copy read-only.

    The hostPath is this cache's own directory, not the node root: the peer pod sees no other cache's copy
    (nor another namespace's), whatever a bug in the server would let a request reach."""
    local = storage.node_local(spec)
    copy_dir = posixpath.join(NODE_ROOT_MOUNT, owner.namespace, owner.name)
    host_copy_dir = posixpath.join(local.path, owner.namespace, owner.name)
    labels = owner.labels(ROLE_PEER)
    node_selector = PAUSED_SELECTOR if paused else {names.node_label_key(owner.namespace, owner.name): "Ready"}
    container: dict[str, Any] = {
        "name": "peer",
        "image": runtime_image(spec, runtime),
        "imagePullPolicy": spec.preload.image_pull_policy.value,
        "command": list(contract.COMMAND),
        "args": [
            "serve-peer",
            copy_dir,
            f"--token-file={TOKEN_MOUNT}/{TOKEN_KEY}",
            "--host=$(POD_IP)",
            f"--port={contract.PEER_PORT}",
        ],
        "env": [
            {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "PYTHONUNBUFFERED", "value": "1"},
        ],
        "ports": [{"name": "peer", "containerPort": contract.PEER_PORT, "protocol": "TCP"}],
        "readinessProbe": {
            "httpGet": {"path": contract.PEER_HEALTH_PATH, "port": "peer"},
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        "resources": PEER_RESOURCES,
        "securityContext": container_security_context(),
        "volumeMounts": [
            {"name": "copy", "mountPath": copy_dir, "readOnly": True},
            {"name": "token", "mountPath": TOKEN_MOUNT, "readOnly": True},
        ],
    }
    pod: dict[str, Any] = {
        "enableServiceLinks": False,
        "automountServiceAccountToken": False,
        "securityContext": pod_security_context(),
        "nodeSelector": node_selector,
        "containers": [container],
        "volumes": [
            {"name": "copy", "hostPath": {"path": host_copy_dir, "type": "Directory"}},
            {"name": "token", "secret": {"secretName": token_secret_name(owner), "defaultMode": 0o440}},
        ],
    }
    if pull_secrets := runtime.pod_pull_secrets():
        pod["imagePullSecrets"] = pull_secrets
    if local.tolerations:
        pod["tolerations"] = list(local.tolerations)
    return {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": _metadata(owner, peer_name(owner)),
        "spec": {
            "selector": {"matchLabels": _peer_selector(owner)},
            "updateStrategy": {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "100%"}},
            "template": {"metadata": {"labels": labels}, "spec": pod},
        },
    }


def build_peer_service(owner: CacheRef) -> dict[str, Any]:
    """Headless: its name resolves to every ready peer pod, and the fetcher reads from all of them."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(owner, peer_name(owner)),
        "spec": {
            "clusterIP": "None",
            "selector": _peer_selector(owner),
            "ports": [{"name": "peer", "port": contract.PEER_PORT, "targetPort": "peer", "protocol": "TCP"}],
        },
    }


def build_peer_network_policy(owner: CacheRef) -> dict[str, Any]:
    """Only this cache's preload pods reach its peers, on the peer port (where a policy engine runs)."""
    fetchers = {names.CACHE_LABEL: owner.name, names.ROLE_LABEL: storage.ROLE_PRELOAD}
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(owner, peer_name(owner)),
        "spec": {
            "podSelector": {"matchLabels": _peer_selector(owner)},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": fetchers}}],
                    "ports": [{"port": contract.PEER_PORT, "protocol": "TCP"}],
                }
            ],
        },
    }


def peer_token(owner: CacheRef) -> GeneratedToken:
    """The peers' token: a peer and a fetcher never disagree about a token in flight (it is never rewritten)."""
    return GeneratedToken(_metadata(owner, token_secret_name(owner)), TOKEN_KEY)


def _metadata(owner: CacheRef, name: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": owner.labels(ROLE_PEER),
        "ownerReferences": [owner.reference()],
    }


def from_peers(
    owner: CacheRef, manifest_sha256: str
) -> Callable[[contract.FetchRequest, PodMounts], contract.FetchRequest]:
    """A node Job's request and mounts when it reads from the peers (the token Secret mounted read-only): only
    peers holding exactly the manifest `manifest_sha256` (the first copy's) are used (`peer_trust`)."""

    def adjust(request: contract.FetchRequest, mounts: PodMounts) -> contract.FetchRequest:
        mounts.add(
            "peer-token",
            {"secret": {"secretName": token_secret_name(owner), "defaultMode": 0o440}},
            TOKEN_MOUNT,
            read_only=True,
        )
        token_file = f"{TOKEN_MOUNT}/{TOKEN_KEY}"
        return request.model_copy(
            update={"peers": [peer_url(owner)], "peer_token_file": token_file, "peer_manifest_sha256": manifest_sha256}
        )

    return adjust


def as_seed(request: contract.FetchRequest, mounts: PodMounts) -> contract.FetchRequest:
    """The first copy hashes every file, so its manifest has the SHA-256 the peers serve and fetchers check."""
    return request.model_copy(update={"verify": contract.VerifyMode.CHECKSUMS})
