"""Fixtures for the real-node tier: a control plane with one real node (containerd, kubelet, kube-proxy, CoreDNS),
Strata's chart installed as a real operator pod from the image built here, an S3 server and an OCI registry the pods
can reach, and namespaces that enforce the `restricted` Pod Security level. Package scope: the node and everything
it holds go as soon as realnode/tests ends, before the kind tier starts its cluster.

Under CI=true a missing prerequisite fails the tier (it can run on this machine); elsewhere it skips with the
reason and the command that fixes it.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient

from strata_testsupport.cluster import missing
from strata_testsupport.helm import CHART, helm_path
from strata_testsupport.kube import new_dynamic_client, resource, wait_for
from strata_testsupport.localcluster.node import (
    NODE_IP,
    NODE_NAME,
    STOCK_VLLM_IMAGE,
    WORK_DIR,
    NodeUnavailable,
    RealNode,
    find_node_binaries,
    leftovers,
    stock_vllm_image_archive,
)
from strata_testsupport.localcluster.node import node_images_archive as build_node_images
from strata_testsupport.pods import STATIC_CLASS, s3_secret, static_volume
from strata_testsupport.processes import serve_for_session
from strata_testsupport.registry import Registry, running_registry
from strata_testsupport.s3 import S3Server, running_s3_server
from strata_testsupport.scenarios import Site

RELEASE_NAMESPACE = "strata-system"
KV_SOCKET_STATE_DIR = WORK_DIR / "kv-sockets"
"""The chart's KV socket driver keeps the tiers' sockets here: under the node's work dir, which the sweep removes."""
RESTRICTED = {"pod-security.kubernetes.io/enforce": "restricted"}


@pytest.fixture(scope="package")
def real_node() -> Iterator[RealNode]:
    try:
        binaries = find_node_binaries()
        images = build_node_images()
    except NodeUnavailable as error:
        missing(str(error))
    with RealNode(images, binaries=binaries) as node:
        yield node
    left = leftovers()
    assert not left, f"the node's teardown left {left}"


@pytest.fixture(scope="package")
def node_k8s(real_node: RealNode) -> DynamicClient:
    """Cluster admin on the real node's cluster."""
    return new_dynamic_client(str(real_node.kubeconfig))


@pytest.fixture(scope="package")
def node_s3(real_node: RealNode) -> Iterator[S3Server]:
    """A real S3 server on the node's address: reachable from its pods, not from outside the machine."""
    with running_s3_server(host=NODE_IP) as server:
        yield server


@pytest.fixture(scope="package")
def node_s3_checking_credentials(real_node: RealNode) -> Iterator[S3Server]:
    """Like node_s3, but the server checks every request's signature against its IAM users."""
    with running_s3_server(host=NODE_IP, authenticate=True) as server:
        yield server


@pytest.fixture(scope="package")
def node_registry(real_node: RealNode) -> Iterator[Registry]:
    """An OCI registry on the node's address, HTTPS with basic auth (pods pull with a pull secret); the node's
    containerd trusts its CA for that address only."""
    start = functools.partial(running_registry, host=NODE_IP, auth=True, parent=WORK_DIR)
    for registry in serve_for_session("OCI registry on the node", start):
        real_node.trust_registry(registry.address, registry.ca_file)
        yield registry


@pytest.fixture(scope="package")
def stock_vllm_image(real_node: RealNode) -> str:
    """vLLM on CPU with nothing of Strata's, in the node's runtime: what a user's own vLLM image is (built when
    missing, about 10 minutes on a fresh machine: vLLM is installed once into the cached engine), imported for the
    tests that serve a model only."""
    try:
        archive = stock_vllm_image_archive()
    except NodeUnavailable as error:
        missing(str(error))
    real_node.import_images(archive)
    return STOCK_VLLM_IMAGE


def helm_cli(real_node: RealNode, *args: str) -> subprocess.CompletedProcess[str]:
    """The Helm CLI built here, against the real node's cluster, with homes of its own (nothing leaks in)."""
    binary = helm_path()
    if not os.access(binary, os.X_OK):
        raise NodeUnavailable(f"no Helm CLI at {binary}: run `bash hack/build-helm.sh`")
    home = real_node.kubeconfig.parent / "helm"
    env = {
        **os.environ,
        "KUBECONFIG": str(real_node.kubeconfig),
        "HELM_CACHE_HOME": str(home / "cache"),
        "HELM_CONFIG_HOME": str(home / "config"),
        "HELM_DATA_HOME": str(home / "data"),
    }
    return subprocess.run([str(binary), *args], capture_output=True, text=True, env=env, timeout=300)


def install_strata(real_node: RealNode, client: DynamicClient) -> float:
    """`helm install` of charts/strata with its defaults; returns the seconds until the operator pod is ready."""
    started = time.monotonic()
    result = helm_cli(
        real_node,
        *("install", "strata", str(CHART), "--namespace", RELEASE_NAMESPACE, "--create-namespace"),
        *("--wait", "--timeout", "180s"),
    )
    if result.returncode != 0:
        raise AssertionError(f"helm install failed:\n{result.stderr}\n{operator_diagnostics(real_node, client)}")
    return round(time.monotonic() - started, 1)


@pytest.fixture(scope="package")
def node_operator(real_node: RealNode, node_k8s: DynamicClient) -> Iterator[dict[str, Any]]:
    """The operator as a pod from its image, with only the chart's RBAC."""
    try:
        seconds = install_strata(real_node, node_k8s)
    except NodeUnavailable as error:
        missing(str(error))
    yield {"namespace": RELEASE_NAMESPACE, "seconds": seconds}
    helm_cli(real_node, "uninstall", "strata", "--namespace", RELEASE_NAMESPACE, "--wait", "--timeout", "120s")


def helm_upgrade(real_node: RealNode, *settings: str) -> None:
    """`helm upgrade --reuse-values` of the installed release with `--set` settings, waited on."""
    args = ["upgrade", "strata", str(CHART), "--namespace", RELEASE_NAMESPACE, "--reuse-values"]
    for setting in settings:
        args += ["--set", setting]
    result = helm_cli(real_node, *args, "--wait", "--timeout", "180s")
    assert result.returncode == 0, f"helm upgrade {settings} failed:\n{result.stderr}\n" + real_node.logs("kubelet")


@pytest.fixture
def kv_socket_driver(real_node: RealNode, node_k8s: DynamicClient, node_operator: Any) -> Iterator[None]:
    """The chart's KV socket driver on the installed release, pointed at the node's kubelet directory; off after."""
    helm_upgrade(
        real_node,
        "kvSocketDriver.enabled=true",
        f"kvSocketDriver.kubeletDir={WORK_DIR / 'kubelet'}",
        f"kvSocketDriver.stateDir={KV_SOCKET_STATE_DIR}",
    )
    yield
    helm_upgrade(real_node, "kvSocketDriver.enabled=false")


def operator_diagnostics(real_node: RealNode, client: DynamicClient) -> str:
    pods = resource(client, "v1", "Pod").get(namespace=RELEASE_NAMESPACE).to_dict()["items"]
    states = [f"{p['metadata']['name']}: {p.get('status', {}).get('containerStatuses')}" for p in pods]
    return "\n".join(states) + "\nkubelet:\n" + real_node.logs("kubelet", 30)


def pod_security_namespace(client: DynamicClient, level: str) -> Iterator[str]:
    """A fresh namespace enforcing Pod Security `level`, deleted (and waited for) afterwards."""
    name = f"rn-{uuid.uuid4().hex[:8]}"
    labels = {"pod-security.kubernetes.io/enforce": level, "pod-security.kubernetes.io/enforce-version": "latest"}
    namespaces = resource(client, "v1", "Namespace")
    namespaces.create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels}})
    wait_for(
        lambda: bool(resource(client, "v1", "ServiceAccount").get(name="default", namespace=name)),
        timeout=60,
        what="the namespace's default service account",
    )
    yield name
    namespaces.delete(name=name)


@pytest.fixture
def restricted_namespace(node_k8s: DynamicClient) -> Iterator[str]:
    yield from pod_security_namespace(node_k8s, "restricted")


@pytest.fixture
def privileged_namespace(node_k8s: DynamicClient) -> Iterator[str]:
    """For what the design cannot run restricted: NodeLocal's hostPath (docs/security.md)."""
    yield from pod_security_namespace(node_k8s, "privileged")


__all__ = ["NODE_IP", "NODE_NAME", "RESTRICTED"]


def held_shared_pvc(cache: str) -> dict[str, Any]:
    """A SharedPVC block whose claim binds only once `static_volume` made its volume: until then the claim is
    Pending, the preloader's pod unschedulable, and the cache cannot turn Ready (`held_storage`)."""
    return {"size": "1Gi", "storageClassName": STATIC_CLASS}


def held_storage(site: Site) -> Site:
    """`site` with the cache's volume left for the test to make (`static_volume(..., f"{cache}-model")`): a test
    that judges what happens before a cache is Ready decides when it may become Ready."""
    return dataclasses.replace(site, shared_pvc=held_shared_pvc)


@pytest.fixture
def node_site(node_k8s: DynamicClient, node_operator: Any, node_s3: S3Server, restricted_namespace: str) -> Site:
    """The real node as a `Site` for the shared scenarios: S3 on the node address, static RWX volumes."""
    s3_secret(node_k8s, restricted_namespace, "s3-credentials", node_s3.access_key, node_s3.secret_key)

    def shared_pvc(cache: str) -> dict[str, Any]:
        static_volume(node_k8s, restricted_namespace, f"{cache}-model")
        return held_shared_pvc(cache)

    return Site(
        client=node_k8s,
        namespace=restricted_namespace,
        s3_endpoint=node_s3.endpoint_url,
        s3_secret="s3-credentials",
        shared_pvc=shared_pvc,
        node_selector={"kubernetes.io/hostname": NODE_NAME},
        region=node_s3.region,
    )
