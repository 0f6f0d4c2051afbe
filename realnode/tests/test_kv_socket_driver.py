"""The CSI node plugin kv.strata.dev on the real node, deployed by the chart (`kvSocketDriver.enabled`): the
kubelet registers it through its plugin-registration socket (the CSINode lists the driver), and in a namespace
that enforces restricted Pod Security a KVCacheTier's server pod (the operator's DaemonSet) listens on a Unix
socket in its inline `csi` volume (the chart's admission policy refuses that volume writable to a hand-made pod)
while a hand-made serving-style pod, another user holding only the socket's group, reaches it through its own
read-only volume of the same tier and gets back the bytes it SET. With the admission policy off, the plugin
itself refuses the issue's attacks: a pod named like the tier's server is not given the directory writable, and
a tier that does not exist gets no directory (the kubelet reports both in the pod's Events). Then a pod the
webhook wires by label alone (volume, group, token, `STRATA_KV_SOCKET`) takes a value back as the server's
memory."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import ApiException
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import NODE_NAME
from strata_testsupport.pods import (
    API,
    RESTRICTED_CONTAINER,
    RUNTIME_IMAGE,
    RUNTIME_UID,
    admission_refusal,
    kv_token_secret,
    pod_log,
    run_pod,
    unique,
)
from strata_testsupport.realnode import KV_SOCKET_STATE_DIR as STATE_DIR
from strata_testsupport.realnode import RELEASE_NAMESPACE, helm_upgrade
from strata_testsupport.scenarios import ready_server

pytestmark = [pytest.mark.integration, pytest.mark.realnode]

DRIVER = "kv.strata.dev"

# In the client pod: wait for the server's socket, SET a 2 MiB value made from a seed, GET it, print its digest.
CLIENT = """
import hashlib, json, os, sys, time
from strata_kv.client import KVClient
path, seed = sys.argv[1], sys.argv[2].encode()
value = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(65536))
deadline = time.monotonic() + 90
while True:
    try:
        kv = KVClient(unix_socket=path, token=os.environ["STRATA_KV_TOKEN"], timeout=20)
        break
    except (FileNotFoundError, ConnectionRefusedError):
        if time.monotonic() > deadline:
            raise
        time.sleep(0.5)
with kv:
    kv.set(b"chunk-" + seed, value)
    got = kv.get(b"chunk-" + seed) or b""
print(json.dumps({"digest": hashlib.sha256(got).hexdigest(), "size": len(got)}))
"""


def _expected_digest(seed: bytes) -> str:
    value = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(65536))
    return hashlib.sha256(value).hexdigest()


def _plugin_logs(client: DynamicClient) -> str:
    pods = resource(client, "v1", "Pod").get(
        namespace=RELEASE_NAMESPACE, label_selector="app.kubernetes.io/component=kv-socket-driver"
    )
    return "\n".join(_log_or_state(client, p) for p in pods.items)


def _log_or_state(client: DynamicClient, pod: Any) -> str:
    """A pod's log, or why its containers have none (CreateContainerError and its message, for one)."""
    try:
        return pod_log(client, RELEASE_NAMESPACE, pod.metadata.name)
    except ApiException:
        statuses = pod.to_dict().get("status", {}).get("containerStatuses") or []
        return f"{pod.metadata.name}: " + json.dumps([s.get("state") for s in statuses])


def _csi_volume(read_only: bool, tier: str = "kv") -> dict[str, Any]:
    return {"name": "kv", "csi": {"driver": DRIVER, "readOnly": read_only, "volumeAttributes": {"tier": tier}}}


def _socket_tier(client: DynamicClient, namespace: str, tier: str) -> None:
    """A KVCacheTier serving a node socket on the node, its token from Secret kv-token."""
    kv_token_secret(client, namespace)
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
        "l1": {"size": "64Mi"},
        "auth": {"secretRef": {"name": "kv-token", "key": "token"}},
        "resources": {"requests": {"cpu": "50m"}},
        "nodeSocket": {"enabled": True},
    }
    resource(client, API, "KVCacheTier").create(
        namespace=namespace,
        body={"apiVersion": API, "kind": "KVCacheTier", "metadata": {"name": tier}, "spec": spec},
    )


def test_restricted_pods_share_a_kv_socket_through_the_driver(real_node, node_k8s, kv_socket_driver):
    def registered() -> list[str] | None:
        node = resource(node_k8s, "storage.k8s.io/v1", "CSINode").get(name=NODE_NAME).to_dict()
        names = [d["name"] for d in node["spec"].get("drivers") or []]
        return names if DRIVER in names else None

    try:
        wait_for(registered, timeout=90, interval=1, what=f"the kubelet to list {DRIVER} in CSINode {NODE_NAME}")
    except AssertionError as error:
        kubelet = "\n".join(line for line in real_node.logs("kubelet", 400).splitlines() if "plugin" in line.lower())
        raise AssertionError(f"{error}\nplugin:\n{_plugin_logs(node_k8s)}\nkubelet (plugins):\n{kubelet}") from error
    namespace = unique("rn-kvsock")
    labels = {
        "pod-security.kubernetes.io/enforce": "restricted",
        "pod-security.kubernetes.io/enforce-version": "latest",
    }
    namespaces, pods = resource(node_k8s, "v1", "Namespace"), resource(node_k8s, "v1", "Pod")
    namespaces.create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace, "labels": labels}})
    try:
        wait_for(
            lambda: bool(resource(node_k8s, "v1", "ServiceAccount").get(name="default", namespace=namespace)),
            timeout=60,
            what="the namespace's default service account",
        )
        server = {
            "name": "kv",
            "image": RUNTIME_IMAGE,
            "imagePullPolicy": "IfNotPresent",
            "command": ["strata-kv", "serve", "--no-tcp", "--unix-socket", "/kv/kv.sock", "--l1-size", "64MiB"],
            "securityContext": RESTRICTED_CONTAINER,
            "volumeMounts": [{"name": "kv", "mountPath": "/kv"}],
        }
        hand_made = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "kv-x2b4c"},
            "spec": {"containers": [server], "volumes": [_csi_volume(False)]},
        }
        # The policy came with the driver a moment ago; the API server learns it from a watch.
        refused = wait_for(
            lambda: admission_refusal(node_k8s, namespace, hand_made, dry_run=True),
            timeout=60,
            what="the chart's admission policy in effect",
        )
        assert "set readOnly: true on the csi volume" in refused, refused
        _socket_tier(node_k8s, namespace, "kv")
        seed = namespace.encode()
        try:
            out = run_pod(
                node_k8s,
                namespace,
                "serving",
                ["python", "-c", CLIENT, "/kv/kv.sock", seed.decode()],
                timeout=240,
                securityContext={"supplementalGroups": [RUNTIME_UID]},  # the socket's group, nothing else
                volumes=[_csi_volume(True)],
                container={
                    "securityContext": {**RESTRICTED_CONTAINER, "runAsUser": 1000, "runAsGroup": 1000},
                    "volumeMounts": [{"name": "kv", "mountPath": "/kv", "readOnly": True}],
                    "env": [
                        {"name": "STRATA_KV_TOKEN", "valueFrom": {"secretKeyRef": {"name": "kv-token", "key": "token"}}}
                    ],
                },
            )
        except AssertionError as error:
            server_pods = pods.get(namespace=namespace, label_selector="app.kubernetes.io/instance=kv").items
            server_log = "\n".join(pod_log(node_k8s, namespace, p.metadata.name) for p in server_pods)
            raise AssertionError(
                f"{error}\nserver:\n{server_log}\nplugin:\n{_plugin_logs(node_k8s)}\n{real_node.logs('kubelet', 40)}"
            ) from error
        result = json.loads(out.strip().splitlines()[-1])
        assert result == {"digest": _expected_digest(seed), "size": 2 * 1024 * 1024}, result
        shared = STATE_DIR / namespace / "kv"
        assert (shared / "kv.sock").is_socket(), "the server's socket lives in the node directory of its tier"
        print("plugin:\n" + "\n".join(line for line in _plugin_logs(node_k8s).splitlines() if "published" in line))
    finally:
        namespaces.delete(name=namespace)
        # Gone before the driver is: the kubelet needs the plugin to unpublish the pods' volumes.
        wait_for(
            lambda: not pods.get(namespace=namespace).items,
            timeout=120,
            interval=1,
            what=f"the pods of {namespace} to be deleted (their volumes unpublished)",
        )


def _mount_failure(client: DynamicClient, namespace: str, pod: str, says: str) -> str:
    """The kubelet's FailedMount Event for `pod` whose message holds `says` (the plugin's refusal), waited for."""

    def reported() -> str | None:
        events = resource(client, "v1", "Event").get(namespace=namespace).to_dict()["items"]
        for event in events:
            mine = event["involvedObject"].get("name") == pod and event.get("reason") == "FailedMount"
            if mine and says in event.get("message", ""):
                return str(event["message"])
        return None

    return wait_for(reported, timeout=120, interval=1, what=f"a FailedMount event of pod {pod} saying {says!r}")


def test_the_driver_itself_refuses_a_server_named_pod_and_made_up_tiers(real_node, node_site, kv_socket_driver):
    """The issue's attacks with the chart's admission policy off, so the plugin alone decides: a tenant pod named
    as the tier's DaemonSet names its pods asks for the directory writable, and a pod asks for tiers that do not
    exist. The kubelet reports both refusals; the server's socket stays where it was."""
    site, tier = node_site, unique("kvsock")
    _socket_tier(site.client, site.namespace, tier)
    server = ready_server(site, tier)
    socket = STATE_DIR / site.namespace / tier / "kv.sock"
    wait_for(socket.is_socket, timeout=60, what=f"the server's socket {socket}")
    container = {
        "name": "main",
        "image": RUNTIME_IMAGE,
        "imagePullPolicy": "IfNotPresent",
        "command": ["sleep", "3600"],
        "securityContext": RESTRICTED_CONTAINER,
    }
    tenant = f"{tier}-ttrn7"
    volumes = {tenant: [_csi_volume(False, tier)]}
    volumes["made-up"] = [{**_csi_volume(True, f"made-up-{i}"), "name": f"kv{i}"} for i in range(3)]
    bodies = {
        name: {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
                "containers": [
                    {
                        **container,
                        "volumeMounts": [{"name": v["name"], "mountPath": f"/{v['name']}"} for v in pod_volumes],
                    }
                ],
                "volumes": pod_volumes,
            },
        }
        for name, pod_volumes in volumes.items()
    }
    probe = {**bodies[tenant], "metadata": {"name": f"{tier}-probe"}}  # tried with dryRun only: never created
    helm_upgrade(real_node, "kvSocketDriver.admissionPolicy.enabled=false")
    pods = resource(site.client, "v1", "Pod")
    try:
        # The API server learns the binding's removal from a watch: until then the policy still refuses the pod.
        wait_for(
            lambda: admission_refusal(site.client, site.namespace, probe, dry_run=True) == "",
            timeout=60,
            what="the admission policy switched off",
        )
        for body in bodies.values():
            pods.create(namespace=site.namespace, body=body)
        refused = _mount_failure(site.client, site.namespace, tenant, "readOnly: false is only for KVCacheTier")
        assert "is not controlled by a DaemonSet" in refused, refused
        missing = _mount_failure(site.client, site.namespace, "made-up", "does not exist")
        assert f"KVCacheTier {site.namespace}/made-up-" in missing, missing
        assert not any((STATE_DIR / site.namespace).glob("made-up-*")), "no directory for a tier that does not exist"
        assert socket.is_socket(), "the server's socket is untouched"
        for name in volumes:
            pods.delete(name=name, namespace=site.namespace)
        assert pods.get(name=server["metadata"]["name"], namespace=site.namespace).status.phase == "Running"
    finally:
        helm_upgrade(real_node, "kvSocketDriver.admissionPolicy.enabled=true")
        wait_for(
            lambda: admission_refusal(site.client, site.namespace, probe, dry_run=True) != "",
            timeout=60,
            what="the admission policy in effect again",
        )


# In a pod the webhook wired: everything from its environment; a 4 MiB value SET over the socket and read back as
# the server's memory (STRATA.GETFD, which get_into asks for on a Unix socket).
WIRED_CLIENT = """
import hashlib, json, mmap, os
from strata_kv.client import KVClient
size = 4 * 1024 * 1024
value = mmap.mmap(-1, size)
value[:] = b"".join(hashlib.sha256(i.to_bytes(4, "big")).digest() for i in range(size // 32))
into = memoryview(mmap.mmap(-1, size))
with KVClient(unix_socket=os.environ["STRATA_KV_SOCKET"], token=os.environ["STRATA_KV_TOKEN"], timeout=20) as kv:
    kv.set_from(b"chunk", memoryview(value))
    hit = kv.get_into(b"chunk", into)
    shared = int(kv.stats().get("shared_replies", 0))
print(json.dumps({"hit": hit, "equal": into == memoryview(value), "shared_replies": shared}))
"""


def test_a_tier_with_a_node_socket_serves_a_pod_the_webhook_wired_by_shared_memory(
    real_node, node_site, kv_socket_driver
):
    site, tier = node_site, unique("kvsock")
    kv_token_secret(site.client, site.namespace)
    spec = {
        "nodeSelector": {"kubernetes.io/hostname": NODE_NAME},
        "l1": {"size": "64Mi"},
        "auth": {"secretRef": {"name": "kv-token", "key": "token"}},
        "resources": {"requests": {"cpu": "50m"}},
        "nodeSocket": {"enabled": True, "sharedMemory": True},
    }
    resource(site.client, API, "KVCacheTier").create(
        namespace=site.namespace,
        body={"apiVersion": API, "kind": "KVCacheTier", "metadata": {"name": tier}, "spec": spec},
    )
    server = ready_server(site, tier)
    assert {"name": "strata-kv-socket", "mountPath": "/run/strata-kv"} in server["spec"]["containers"][0][
        "volumeMounts"
    ]
    try:
        out = run_pod(
            site.client,
            site.namespace,
            "wired",
            ["python", "-c", WIRED_CLIENT],
            timeout=240,
            labels={"strata.dev/kv-cache-tier": tier},
            container={"securityContext": {**RESTRICTED_CONTAINER, "runAsUser": 1000, "runAsGroup": 1000}},
        )
    except AssertionError as error:
        server_log = pod_log(site.client, site.namespace, server["metadata"]["name"])
        raise AssertionError(f"{error}\nserver:\n{server_log}\nplugin:\n{_plugin_logs(site.client)}") from error
    result = json.loads(out.strip().splitlines()[-1])
    assert result == {"hit": True, "equal": True, "shared_replies": 1}, result
    wired = resource(site.client, "v1", "Pod").get(name="wired", namespace=site.namespace).to_dict()["spec"]
    assert RUNTIME_UID in wired["securityContext"]["supplementalGroups"], "the webhook gave the socket's group"
    assert (STATE_DIR / site.namespace / tier / "kv.sock").is_socket()
