"""Helm itself against the local control plane: install, upgrade both ways across replicaCount 1 <-> 2 (the
Deployment's strategy changes type), and uninstall, checking what each step leaves in the cluster."""

from __future__ import annotations

import json
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from kubernetes.dynamic.exceptions import NotFoundError
from strata_testsupport.kube import resource

pytestmark = pytest.mark.integration


@pytest.fixture
def release_namespace(k8s: DynamicClient) -> Iterator[str]:
    name = f"helm-{uuid.uuid4().hex[:8]}"
    resource(k8s, "v1", "Namespace").create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    resource(k8s, "v1", "Namespace").delete(name=name)


def exists(k8s: DynamicClient, api_version: str, kind: str, name: str, namespace: str | None = None) -> bool:
    try:
        resource(k8s, api_version, kind).get(name=name, namespace=namespace)
    except NotFoundError:
        return False
    return True


def chart_for(control_plane: Any, chart: Path, tmp: Path) -> str:
    """The chart, or, when the API server was built without its version stamp (it then reports
    v0.0.0-master and Helm refuses the chart's kubeVersion), a copy without that one constraint."""
    status, body = control_plane.api_get("/version")
    assert status == 200, body
    if re.match(r"v1\.\d+\.\d+", json.loads(body)["gitVersion"]):
        return str(chart)
    copy = tmp / "strata"
    shutil.copytree(chart, copy)  # follows files/crds, like `helm package`
    chart_yaml = copy / "Chart.yaml"
    chart_yaml.write_text(re.sub(r"^kubeVersion:.*\n", "", chart_yaml.read_text(), flags=re.M))
    return str(copy)


def test_install_upgrade_and_uninstall_with_helm(k8s, control_plane, helm, chart_helpers, release_namespace, tmp_path):
    release = f"h{uuid.uuid4().hex[:6]}"
    peering = f"{release}-peering"
    chart = chart_for(control_plane, chart_helpers.chart, tmp_path)
    # Strata's CRDs are shared with the other tests in this cluster (installed without Helm's ownership
    # labels), so this release leaves them out; test_chart_install.py applies them from the chart.
    base = ["--namespace", release_namespace, "--kubeconfig", str(control_plane.kubeconfig)]
    base += ["--set", "crds.install=false", "--set", f"peering.name={peering}"]
    deployments = resource(k8s, "apps/v1", "Deployment")

    def strategy() -> dict[str, Any]:
        return deployments.get(name=f"{release}-strata", namespace=release_namespace).to_dict()["spec"]["strategy"]

    helm.run("install", release, chart, *base)
    assert strategy() == {"type": "Recreate"}
    assert exists(k8s, "rbac.authorization.k8s.io/v1", "ClusterRole", f"{release}-strata-cluster")

    helm.run("upgrade", release, chart, *base, "--set", "replicaCount=2")
    assert strategy()["type"] == "RollingUpdate"
    assert exists(k8s, "kopf.dev/v1", "ClusterKopfPeering", peering)

    # Back to one replica: the live rollingUpdate defaults must not block the switch to Recreate.
    helm.run("upgrade", release, chart, *base, "--set", "replicaCount=1")
    assert strategy() == {"type": "Recreate"}
    assert not exists(k8s, "kopf.dev/v1", "ClusterKopfPeering", peering)

    helm.run("uninstall", release, *base[:4])
    assert not exists(k8s, "apps/v1", "Deployment", f"{release}-strata", release_namespace)
    for kind, name in (("ClusterRole", "cluster"), ("ClusterRole", "namespaced"), ("ClusterRoleBinding", "cluster")):
        assert not exists(k8s, "rbac.authorization.k8s.io/v1", kind, f"{release}-strata-{name}")
