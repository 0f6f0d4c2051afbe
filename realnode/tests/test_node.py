"""The real node itself: a pod from the runtime image built here starts under `restricted` Pod Security, cluster
DNS answers `<svc>.<ns>.svc` names, and kube-proxy carries a Service's ClusterIP to the API server."""

from __future__ import annotations

import json
from typing import Any

import pytest
from kubernetes.client import CoreV1Api
from strata_testsupport.kube import resource, wait_for
from strata_testsupport.localcluster.node import NODE_NAME
from strata_testsupport.realnode import RESTRICTED

pytestmark = [pytest.mark.integration, pytest.mark.realnode]
RUNTIME_IMAGE = "ghcr.io/strata-dev/strata-runtime:0.1.0"
RESTRICTED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 65532,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def run_pod(client: Any, namespace: str, name: str, command: list[str], timeout: float = 120) -> str:
    """Run one container to completion on the real node and return its log; fail with the pod's state."""
    pods = resource(client, "v1", "Pod")
    pods.create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name},
            "spec": {
                "restartPolicy": "Never",
                "containers": [
                    {
                        "name": "main",
                        "image": RUNTIME_IMAGE,
                        "imagePullPolicy": "IfNotPresent",
                        "command": command,
                        "securityContext": RESTRICTED_CONTAINER,
                    }
                ],
            },
        },
    )

    def finished() -> str | None:
        phase = pods.get(name=name, namespace=namespace).status.phase
        return phase if phase in ("Succeeded", "Failed") else None

    phase = wait_for(finished, timeout=timeout, interval=0.5, what=f"pod {name} to finish")
    log = pods.get(name=name, namespace=namespace)
    # Raw bytes: the client would parse a log that looks like JSON into a dict.
    raw = CoreV1Api(client.client).read_namespaced_pod_log(name=name, namespace=namespace, _preload_content=False)
    text = raw.data.decode()
    assert phase == "Succeeded", f"pod {name} {phase}: {log.status.containerStatuses}\n{text}"
    return text


def test_node_is_ready_and_real(node_k8s):
    node = resource(node_k8s, "v1", "Node").get(name=NODE_NAME).to_dict()
    assert "kwok.x-k8s.io/node" not in (node["metadata"].get("annotations") or {})
    assert node["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("containerd://")
    assert any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"]["conditions"])


def test_a_restricted_pod_resolves_services_and_reaches_the_api_server(node_k8s, restricted_namespace):
    namespace = resource(node_k8s, "v1", "Namespace").get(name=restricted_namespace).to_dict()
    assert RESTRICTED.items() <= namespace["metadata"]["labels"].items()
    script = (
        "import json, socket, ssl, urllib.request\n"
        "address = socket.gethostbyname('kubernetes.default.svc.cluster.local')\n"
        "ctx = ssl.create_default_context(cafile='/var/run/secrets/kubernetes.io/serviceaccount/ca.crt')\n"
        "token = open('/var/run/secrets/kubernetes.io/serviceaccount/token').read()\n"
        "req = urllib.request.Request('https://kubernetes.default.svc/version',"
        " headers={'Authorization': 'Bearer ' + token})\n"
        "version = json.load(urllib.request.urlopen(req, context=ctx, timeout=10))\n"
        "print(json.dumps({'address': address, 'version': version['gitVersion']}))\n"
    )
    out = run_pod(node_k8s, restricted_namespace, "dns-and-api", ["python", "-c", script])
    result = json.loads(out.strip().splitlines()[-1])
    service = resource(node_k8s, "v1", "Service").get(name="kubernetes", namespace="default")
    assert result["address"] == service.spec.clusterIP
    assert result["version"].startswith("v1.37")
