"""The real node itself: a pod from the runtime image built here starts under `restricted` Pod Security, cluster
DNS answers `<svc>.<ns>.svc` names, and kube-proxy carries a Service's ClusterIP to the API server."""

from __future__ import annotations

import json

import pytest
from strata_testsupport.kube import resource
from strata_testsupport.localcluster.node import NODE_NAME
from strata_testsupport.pods import run_pod
from strata_testsupport.realnode import RESTRICTED

pytestmark = [pytest.mark.integration, pytest.mark.realnode]


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
