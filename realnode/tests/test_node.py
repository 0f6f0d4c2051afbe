"""The real node itself: a pod from the runtime image built here starts under `restricted` Pod Security, cluster
DNS answers `<svc>.<ns>.svc` names, kube-proxy carries a Service's ClusterIP to the API server, and a container's
log comes back through the API server from the kubelet as the container printed it."""

from __future__ import annotations

import json

import pytest
from strata_loader.contract import CompileCaptureReport
from strata_operator import kube
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


def test_the_operators_log_read_returns_a_json_line_as_the_container_printed_it(
    real_node, node_k8s, restricted_namespace, monkeypatch
):
    """The operator learns of a compile capture from the sidecar's last log line (`kube.pod_log`). A log that is
    one JSON document must come back as printed: left to deserialize it, the kubernetes client parsed it and
    returned the Python repr (single quotes), which no JSON parser reads."""
    line = json.dumps({"event": "captured", "key": "ab" * 32, "generation": "gen-1-ab", "files": 3, "bytes": 10})
    run_pod(node_k8s, restricted_namespace, "json-log", ["python", "-c", f"print({line!r})"])
    monkeypatch.setenv("KUBECONFIG", str(real_node.kubeconfig))
    kube.reset_clients()
    try:
        text = kube.pod_log(restricted_namespace, "json-log", "main", tail_lines=20, limit_bytes=64 * 1024)
    finally:
        kube.reset_clients()
    assert text == line + "\n"
    report = CompileCaptureReport.from_log(text)
    assert report is not None and (report.event, report.files) == ("captured", 3)
