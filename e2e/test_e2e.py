"""Strata end to end on kind with a GPU node: install the chart, preload a model from an in-cluster S3 server
and load it onto the GPU, serve KV cache from the node's own server, then delete everything and check that
nothing is left. The tests run in file order and share one cluster; each states what it proves.

The scenarios themselves (preload and read back, a tier serving its node, deletion) are the ones the local
real node runs (strata_testsupport.scenarios); this suite adds what needs a GPU."""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import yaml

# The first test sets up the session: a kind cluster, the images (the runtime's torch alone is gigabytes),
# the GPU node. That can take longer than the project's default per-test timeout.
pytestmark = [pytest.mark.integration, pytest.mark.kind, pytest.mark.timeout(3600)]

MODEL = "e2e-tiny"
TIER = "e2e-kv"
API = "strata.dev/v1alpha1"
MANAGED = "app.kubernetes.io/managed-by=strata"


@pytest.fixture(scope="module")
def workspace(strata_release, gpu_node, e2e_namespace, scripts_config_map, k8s_e2e, e2e) -> dict[str, Any]:
    """The S3 server with a tiny model uploaded to it (by a Job from the runtime image)."""
    from strata_testsupport.kube import resource, wait_for

    for obj in yaml.safe_load_all((e2e.e2e_dir / "manifests" / "s3.yaml").read_text()):
        e2e.apply_object(k8s_e2e, obj, e2e_namespace)
    deployments = resource(k8s_e2e, "apps/v1", "Deployment")
    wait_for(
        lambda: (deployments.get(name="s3", namespace=e2e_namespace).status.readyReplicas or 0) >= 1,
        timeout=180,
        interval=2,
        what="the S3 server",
    )
    env = [
        {"name": "S3_ENDPOINT", "value": "http://s3:9000"},
        {"name": "S3_BUCKET", "value": "models"},
        {"name": "S3_PREFIX", "value": "tiny"},
    ]
    upload = e2e.runtime_job(
        "upload-model", "make_model.py", env=env, env_from=[{"secretRef": {"name": "s3-credentials"}}]
    )
    uploaded = e2e.run_job(k8s_e2e, upload, e2e_namespace)["result"]
    return {"namespace": e2e_namespace, "gpu_node": gpu_node, "expected": uploaded["tensors"]}


@pytest.fixture(scope="module")
def site(k8s_e2e, workspace, e2e) -> Any:
    """This cluster as a scenario `Site`: the in-cluster S3 Service, kind's RWO local-path claims, the GPU node."""
    from strata_testsupport.scenarios import Site

    namespace = workspace["namespace"]
    return Site(
        client=k8s_e2e,
        namespace=namespace,
        s3_endpoint=f"http://s3.{namespace}.svc:9000",
        s3_secret="s3-credentials",
        # kind's local-path provisioner has no ReadWriteMany; one GPU node needs none.
        shared_pvc=lambda _cache: {"size": "1Gi", "accessMode": "ReadWriteOnce"},
        node_selector={"strata.dev/e2e-gpu": "true"},
        runtime_image=e2e.runtime_image,
    )


def test_operator_is_available(k8s_e2e, strata_release, e2e):
    from strata_testsupport.kube import resource

    deployment = resource(k8s_e2e, "apps/v1", "Deployment").get(name="strata", namespace=e2e.release_namespace)
    assert deployment.status.availableReplicas == 1


def test_modelcache_preloads_from_s3_and_the_gpu_loads_it(k8s_e2e, workspace, site, e2e):
    from strata_testsupport.scenarios import consumer_reads_every_tensor, preload_from_s3

    namespace = workspace["namespace"]
    ready = {"status": preload_from_s3(site, MODEL, "s3://models/tiny")}
    consumer_reads_every_tensor(site, ready["status"], workspace["expected"])

    # The consumption contract: paste status.volume into a pod, on the GPU node, and load with Strata's loader.
    snippet = ready["status"]["volume"]
    job = e2e.runtime_job(
        "gpu-load",
        "gpu_load.py",
        gpu=True,
        env=[{"name": "MODEL_DIR", "value": snippet["volumeMount"]["mountPath"]}],
        volumes=[snippet["volume"]],
        mounts=[snippet["volumeMount"]],
    )
    outcome = e2e.run_job(k8s_e2e, job, namespace)
    assert outcome["node"] == workspace["gpu_node"]
    assert outcome["result"]["devices"] == ["cuda:0"]
    assert outcome["result"]["tensors"] == workspace["expected"], "bytes on the GPU differ from the uploaded model"


def test_kvcachetier_serves_a_pod_from_its_own_node(k8s_e2e, workspace, site, e2e):
    from strata_testsupport.pods import kv_token_secret
    from strata_testsupport.scenarios import tier_serves_a_pod_on_its_node

    tier = copy.deepcopy(e2e.sample("KVCacheTier"))
    spec = tier["spec"]
    # The image under test, on the GPU node, with an L1 small enough for a kind node, no L2.
    spec.update(image=e2e.runtime_image, imagePullPolicy="IfNotPresent", nodeSelector=site.node_selector)
    spec["l1"] = {**(spec.get("l1") or {}), "size": "256Mi"}
    spec["auth"] = {"secretRef": {"name": "kv-token", "key": "token"}}
    spec.pop("l2", None)
    spec.pop("resources", None)
    kv_token_secret(k8s_e2e, site.namespace)
    server = tier_serves_a_pod_on_its_node(site, TIER, spec)
    assert server["spec"]["nodeName"] == workspace["gpu_node"]


def test_deleting_everything_leaves_nothing_behind(k8s_e2e, workspace, site, strata_release, e2e):
    from strata_testsupport.kube import resource
    from strata_testsupport.scenarios import deleting_leaves_nothing_behind

    deleting_leaves_nothing_behind(site, [MODEL], [TIER])

    env = {"KUBECONFIG": strata_release["kubeconfig"]}
    e2e.run(
        strata_release["helm"],
        "uninstall",
        e2e.release,
        "--namespace",
        e2e.release_namespace,
        "--wait",
        env={**os.environ, **env},
    )
    e2e.wait_gone(k8s_e2e, "apps/v1", "Deployment", e2e.release_namespace, "app.kubernetes.io/instance=strata")
    roles = resource(k8s_e2e, "rbac.authorization.k8s.io/v1", "ClusterRole").get(
        label_selector="app.kubernetes.io/instance=strata"
    )
    assert not roles.items
    # The CRDs stay (helm.sh/resource-policy: keep): uninstalling the operator must not delete users' caches.
    crds = resource(k8s_e2e, "apiextensions.k8s.io/v1", "CustomResourceDefinition")
    assert crds.get(name="modelcaches.strata.dev") and crds.get(name="kvcachetiers.strata.dev")
