"""KVCacheTier against the real local control plane: API validation, the DaemonSet controller placing one
server per fake GPU node (kwok runs the pods), status following readiness, rollout, drift repair, garbage
collection through ownerReferences.
"""

from __future__ import annotations

import base64
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from strata_operator.handlers.kvcachetier import reconcile as reconciler
from strata_operator.resources.kvcachetier.names import CONFIG_HASH_ANNOTATION
from strata_testsupport.apirequests import requests_of
from strata_testsupport.kube import (
    create_fake_node,
    delete_and_collect,
    delete_quietly,
    get_or_none,
    resource,
    wait_for,
)

pytestmark = pytest.mark.integration

API = "strata.dev/v1alpha1"
KIND = "KVCacheTier"
GPU_TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


@pytest.fixture
def gpu_pool(k8s: DynamicClient, namespace: str) -> Iterator[dict[str, str]]:
    """Two tainted GPU nodes and one CPU node, labelled with a pool unique to this test."""
    pool = {"strata.test/pool": namespace}
    names = [f"{namespace}-gpu-0", f"{namespace}-gpu-1", f"{namespace}-cpu-0"]
    for name in names[:2]:
        create_fake_node(k8s, name, labels={**pool, "gpu": "true"}, taints=[GPU_TAINT])
    create_fake_node(k8s, names[2], labels={**pool, "gpu": "false"}, allocatable={"memory": "8Gi"})
    yield pool
    for name in names:
        delete_quietly(k8s, "v1", "Node", name, None)


def tier_body(name: str, pool: dict[str, str], **spec: Any) -> dict[str, Any]:
    return {
        "apiVersion": API,
        "kind": KIND,
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {**pool, "gpu": "true"},
            "tolerations": [GPU_TOLERATION],
            "l1": {"size": "2Gi"},
            **spec,
        },
    }


def create_tier(k8s: DynamicClient, namespace: str, body: dict[str, Any]) -> Any:
    return resource(k8s, API, KIND).create(body=body, namespace=namespace)


def tier(k8s: DynamicClient, namespace: str, name: str) -> dict[str, Any]:
    return dict(resource(k8s, API, KIND).get(name=name, namespace=namespace).to_dict())


def condition(obj: dict[str, Any], type_: str) -> tuple[str, str] | None:
    for c in (obj.get("status") or {}).get("conditions") or []:
        if c["type"] == type_:
            return c["status"], c["reason"]
    return None


def diagnose(k8s: DynamicClient, namespace: str, name: str) -> str:
    """What the tier, its DaemonSet and pods look like: printed when a wait times out."""
    ds = daemonset(k8s, namespace, name)
    pods = resource(k8s, "v1", "Pod").get(namespace=namespace).items
    summary = [(p.metadata.name, p.spec.nodeName, p.status.phase) for p in pods]
    return (
        f"tier status: {tier(k8s, namespace, name).get('status')}\n"
        f"daemonset status: {ds.to_dict().get('status') if ds else None}\npods: {summary}"
    )


def wait_condition(k8s: DynamicClient, namespace: str, name: str, type_: str, expected: tuple[str, str]) -> None:
    try:
        wait_for(lambda: condition(tier(k8s, namespace, name), type_) == expected, timeout=90)
    except AssertionError:
        raise AssertionError(f"{name}: {type_} never became {expected}\n{diagnose(k8s, namespace, name)}") from None


def tier_warnings(k8s: DynamicClient, namespace: str, name: str) -> list[tuple[str, str]]:
    """(reason, message) of the Warning Events posted about the tier."""
    events = resource(k8s, "v1", "Event").get(namespace=namespace).items
    return [
        (e.reason, e.message)
        for e in events
        if e.type == "Warning" and e.involvedObject.kind == KIND and e.involvedObject.name == name
    ]


def daemonset(k8s: DynamicClient, namespace: str, name: str) -> Any:
    return get_or_none(k8s, "apps/v1", "DaemonSet", name, namespace)


def require_kwok(control_plane: Any) -> None:
    if not (control_plane.want_kwok and control_plane.want_scheduler):
        pytest.skip("kwok and kube-scheduler are not built: pods cannot be scheduled or become ready")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"l2": {"fs": {"pvc": {"claimName": "a"}, "hostPath": {"path": "/x"}}}}, "exactly one of pvc or hostPath"),
        ({"l2": {"s3": {"bucket": "kvc", "endpoint": "http://s3:9000"}}}, "needs l2.s3.secretRef"),
        (
            {"l2": {"fs": {"hostPath": {"path": "/x"}, "lowWatermarkPercent": 95}}},
            "lowWatermarkPercent must be below",
        ),
        ({"l1": {"size": "0"}}, "l1.size must be greater than 0"),
        ({"port": 9121}, "port and metricsPort must differ"),
        ({"events": {"enabled": True, "port": 6379}}, "events.port must differ from port and metricsPort"),
        ({"events": {"enabled": True, "port": 0}}, "spec.events.port"),
        ({"senderThreads": 65}, "spec.senderThreads"),
        ({"nodeSocket": {"sharedMemory": True}}, "nodeSocket.sharedMemory hands memory over the node socket"),
        ({"nodeSocket": {"enabled": True, "driver": "Not_A_Driver"}}, "spec.nodeSocket.driver"),
        (
            {"auth": {"disabled": True, "secretRef": {"name": "t"}}},
            "auth.disabled and auth.secretRef exclude each other",
        ),
        ({"hash": {"seed": "9999999999"}}, "hash.seed must be at most"),
        ({"l2": {"fs": {"hostPath": {"path": "/etc"}}}}, "must not be a system directory"),
        ({"l2": {"fs": {"hostPath": {"path": "/"}}}}, "must not be a system directory"),
        ({"l2": {"fs": {"hostPath": {"path": "/var/lib/containerd/x"}}}}, "must not be a system directory"),
        ({"l2": {"fs": {"hostPath": {"path": "/mnt/../etc"}}}}, "clean absolute path"),
        (
            {"l2": {"s3": {"bucket": "kvc", "endpoint": "http://169.254.169.254", "secretRef": {"name": "s3"}}}},
            "l2.s3.endpoint points at a link-local or cloud metadata address",
        ),
        (
            {"l2": {"s3": {"bucket": "kvc", "endpoint": "http://[fe80::1]:9000", "secretRef": {"name": "s3"}}}},
            "set l2.s3.allowLinkLocal: true",
        ),
    ],
)
def test_api_server_rejects_invalid_specs(
    k8s: DynamicClient, strata_crds: Any, namespace: str, spec: dict[str, Any], message: str
) -> None:
    with pytest.raises(ApiException) as error:
        create_tier(k8s, namespace, tier_body("bad", {}, **spec))
    assert error.value.status == 422
    assert message in error.value.body


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"l1": {"size": "1.5Gi"}}, "spec.l1.size"),
        ({"l1": {"size": "500m"}}, "spec.l1.size"),
        ({"memoryHeadroom": "0.5Gi"}, "spec.memoryHeadroom"),
        ({"l2": {"fs": {"hostPath": {"path": "/mnt/kv"}, "capacity": "1.5T"}}}, "spec.l2.fs.capacity"),
        ({"l2": {"fs": {"pvc": {"create": {"size": "2.5Ti"}}}}}, "spec.l2.fs.pvc.create.size"),
    ],
)
def test_api_server_refuses_fractional_sizes(
    k8s: DynamicClient, strata_crds: Any, namespace: str, spec: dict[str, Any], field: str
) -> None:
    with pytest.raises(ApiException) as error:
        create_tier(k8s, namespace, tier_body("frac", {}, **spec))
    assert error.value.status == 422
    assert field in error.value.body and "whole number of bytes" in error.value.body


def test_a_link_local_s3_endpoint_is_accepted_when_allowed(
    k8s: DynamicClient, strata_crds: Any, namespace: str
) -> None:
    s3 = {"bucket": "kvc", "endpoint": "http://169.254.10.20", "secretRef": {"name": "s3"}, "allowLinkLocal": True}
    create_tier(k8s, namespace, tier_body("allowed", {}, l2={"s3": s3}))


def test_defaults_come_from_the_schema(k8s: DynamicClient, strata_crds: Any, namespace: str) -> None:
    created = create_tier(k8s, namespace, {"apiVersion": API, "kind": KIND, "metadata": {"name": "d"}, "spec": {}})
    spec = created.to_dict()["spec"]
    assert spec["l1"] == {"size": "4Gi", "evictionPolicy": "prefix-lirs"}
    assert spec["hash"] == {"algorithm": "sha256_cbor"}
    assert spec["updateStrategy"] == {"type": "RollingUpdate"}
    assert (spec["chunkTokens"], spec["port"], spec["metricsPort"]) == (256, 6379, 9121)
    assert spec["connector"] == {"type": "vllm", "cpuBytes": "4Gi", "offloadPromptOnly": True, "engine": "gpu"}
    assert spec["events"] == {"enabled": False, "port": 5557}


def test_one_ready_server_per_gpu_node(
    k8s: DynamicClient, operator: Any, control_plane: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    # The API server's PodSecurity admission refuses any server pod that breaks the restricted profile.
    resource(k8s, "v1", "Namespace").patch(
        name=namespace,
        body={"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}},
        content_type="application/merge-patch+json",
    )
    create_tier(k8s, namespace, tier_body("kv", gpu_pool, chunkTokens=512, hash={"seed": "1234"}))
    ds = wait_for(lambda: daemonset(k8s, namespace, "kv"), timeout=60, what="DaemonSet kv")
    wait_for(
        lambda: (daemonset(k8s, namespace, "kv").status or {}).get("desiredNumberScheduled") == 2,
        timeout=60,
        what="two GPU nodes selected",
    )
    service = resource(k8s, "v1", "Service").get(name="kv", namespace=namespace)
    assert service.spec.internalTrafficPolicy == "Local"
    connection = resource(k8s, "v1", "ConfigMap").get(name="kv-connection", namespace=namespace).data
    transfer = json.loads(connection["KV_TRANSFER_CONFIG"])
    assert transfer["kv_connector"] == "OffloadingConnector" and transfer["kv_role"] == "kv_both"
    extra = transfer["kv_connector_extra_config"]
    assert extra["spec_name"] == "TieringOffloadingSpec" and extra["block_size"] == 512
    assert extra["secondary_tiers"][0]["url"] == f"redis://kv.{namespace}.svc:6379"
    assert connection["PYTHONHASHSEED"] == "1234"
    assert connection["PREFIX_CACHING_HASH_ALGO"] == "sha256_cbor"
    assert ds.spec.template.metadata.annotations[CONFIG_HASH_ANNOTATION]
    wait_for(
        lambda: len(resource(k8s, "v1", "Pod").get(namespace=namespace).items) == 2,
        timeout=60,
        what="two server pods admitted under the restricted profile",
    )

    require_kwok(control_plane)
    wait_condition(k8s, namespace, "kv", "AllInstancesReady", ("True", "AllReady"))
    status = tier(k8s, namespace, "kv")["status"]
    assert (status["desiredInstances"], status["readyInstances"]) == (2, 2)
    assert sorted(e["node"] for e in status["endpoints"]) == [f"{namespace}-gpu-0", f"{namespace}-gpu-1"]
    assert all(e["ready"] and e["address"].endswith(":6379") for e in status["endpoints"])
    assert condition(tier(k8s, namespace, "kv"), "Available") == ("True", "InstancesServing")
    assert condition(tier(k8s, namespace, "kv"), "Ready") == ("True", "AllReady")
    # A healthy creation is no cause for alarm (it used to post Warning NoMatchingNodes and NoReadyInstances).
    assert tier_warnings(k8s, namespace, "kv") == []


def test_config_change_rolls_out(
    k8s: DynamicClient, operator: Any, control_plane: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    create_tier(k8s, namespace, tier_body("kv", gpu_pool))
    wait_for(lambda: daemonset(k8s, namespace, "kv"), timeout=60, what="DaemonSet kv")
    before = daemonset(k8s, namespace, "kv").spec.template.metadata.annotations[CONFIG_HASH_ANNOTATION]
    patch = {"spec": {"l1": {"size": "3Gi"}}}
    resource(k8s, API, KIND).patch(
        body=patch, name="kv", namespace=namespace, content_type="application/merge-patch+json"
    )

    def rolled() -> bool:
        annotations = daemonset(k8s, namespace, "kv").spec.template.metadata.annotations
        return bool(annotations[CONFIG_HASH_ANNOTATION] != before)

    wait_for(rolled, timeout=60, what="pod template config-hash changed")
    config = resource(k8s, "v1", "ConfigMap").get(name="kv-config", namespace=namespace).data
    assert "size: 3GiB" in config["strata-kv.yaml"]
    new_hash = daemonset(k8s, namespace, "kv").spec.template.metadata.annotations[CONFIG_HASH_ANNOTATION]
    wait_for(lambda: tier(k8s, namespace, "kv")["status"].get("configHash") == new_hash, timeout=60)

    require_kwok(control_plane)
    wait_condition(k8s, namespace, "kv", "AllInstancesReady", ("True", "AllReady"))
    pods = resource(k8s, "v1", "Pod").get(namespace=namespace, label_selector="app.kubernetes.io/instance=kv")
    live = [p for p in pods.items if not p.metadata.deletionTimestamp]
    assert {p.metadata.annotations[CONFIG_HASH_ANNOTATION] for p in live} == {new_hash}


def _child_versions(k8s: DynamicClient, namespace: str) -> dict[str, str]:
    versions = {}
    for api_version, kind, name in (
        ("apps/v1", "DaemonSet", "kv"),
        ("v1", "Service", "kv"),
        ("v1", "ConfigMap", "kv-config"),
        ("v1", "ConfigMap", "kv-connection"),
    ):
        versions[f"{kind}/{name}"] = (
            resource(k8s, api_version, kind).get(name=name, namespace=namespace).metadata.resourceVersion
        )
    return versions


def test_deleted_and_edited_children_are_restored_and_a_rerun_writes_nothing(
    k8s: DynamicClient, operator: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    create_tier(k8s, namespace, tier_body("kv", gpu_pool))
    wait_for(lambda: daemonset(k8s, namespace, "kv"), timeout=60, what="DaemonSet kv")
    configmaps = resource(k8s, "v1", "ConfigMap")
    wait_for(lambda: get_or_none(k8s, "v1", "ConfigMap", "kv-connection", namespace), timeout=30)
    original = configmaps.get(name="kv-config", namespace=namespace).data["strata-kv.yaml"]

    resource(k8s, "v1", "Service").delete(name="kv", namespace=namespace)
    configmaps.delete(name="kv-connection", namespace=namespace)
    configmaps.patch(
        body={"data": {"strata-kv.yaml": "l1: {size: 1}\n"}},
        name="kv-config",
        namespace=namespace,
        content_type="application/merge-patch+json",
    )
    resource(k8s, "apps/v1", "DaemonSet").patch(
        body={"spec": {"template": {"spec": {"containers": [{"name": "kvserver", "image": "evil:latest"}]}}}},
        name="kv",
        namespace=namespace,
        content_type="application/strategic-merge-patch+json",
    )

    wait_for(lambda: get_or_none(k8s, "v1", "Service", "kv", namespace), timeout=30, what="Service restored")
    wait_for(lambda: get_or_none(k8s, "v1", "ConfigMap", "kv-connection", namespace), timeout=30, what="restored")
    wait_for(
        lambda: configmaps.get(name="kv-config", namespace=namespace).data["strata-kv.yaml"] == original,
        timeout=30,
        what="config restored",
    )
    wait_for(
        lambda: daemonset(k8s, namespace, "kv").spec.template.spec.containers[0].image != "evil:latest",
        timeout=30,
        what="DaemonSet image restored",
    )

    # The image edit and its repair each rolled the pods; the world is settled once that rollout is done.
    wait_for(lambda: _rolled_out(daemonset(k8s, namespace, "kv")), timeout=60, what="DaemonSet rollout finished")
    # Settled: one more reconcile changes nothing on the server. Its applies reach every child and leave each one
    # as it was; it writes nothing on the tier. The operator's daemon reconciles the same tier meanwhile and may
    # rightly write its status (a usage scrape, a condition it saw change): so the tier is judged by the requests
    # this reconcile made, the children (which only applies write) by their versions.
    wait_for(lambda: reconciler.reconcile(tier(k8s, namespace, "kv")) is not None, timeout=10)
    before = _child_versions(k8s, namespace)
    outcome, requests = requests_of(reconciler.reconcile, tier(k8s, namespace, "kv"))
    assert outcome is not None and outcome.applied and not outcome.status_written
    assert {(r.verb, r.resource) for r in requests} >= {("get", "kvcachetiers"), ("patch", "daemonsets")}, requests
    assert [r for r in requests if r.resource == "kvcachetiers" and r.verb not in ("get", "list", "watch")] == []
    assert _child_versions(k8s, namespace) == before


def _rolled_out(ds: Any) -> bool:
    """Every pod runs the current template and is available (what `kubectl rollout status` waits for)."""
    status = ds.status
    desired = status.desiredNumberScheduled or 0
    return bool(
        ds.metadata.generation == status.observedGeneration
        and desired > 0
        and status.updatedNumberScheduled == desired
        and status.numberAvailable == desired
        and not status.numberUnavailable
    )


def test_deleting_the_tier_removes_its_children(
    k8s: DynamicClient, operator: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    create_tier(k8s, namespace, tier_body("kv", gpu_pool))
    wait_for(lambda: daemonset(k8s, namespace, "kv"), timeout=60, what="DaemonSet kv")
    resource(k8s, API, KIND).delete(name="kv", namespace=namespace)
    for kind, name in (("DaemonSet", "kv"), ("ConfigMap", "kv-config"), ("ConfigMap", "kv-connection")):
        api_version = "apps/v1" if kind == "DaemonSet" else "v1"
        wait_for(
            lambda: get_or_none(k8s, api_version, kind, name, namespace) is None,  # noqa: B023
            timeout=60,
            what=f"{kind} {name} garbage-collected",
        )


def test_a_users_config_map_under_a_childs_name_is_never_taken_over(
    k8s: DynamicClient, operator: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    """Forced apply would make the tier its controller, and deleting the tier would delete it."""
    config_maps = resource(k8s, "v1", "ConfigMap")
    mine = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "kv-config"}, "data": {"mine": "yes"}}
    config_maps.create(namespace=namespace, body=mine)
    create_tier(k8s, namespace, tier_body("kv", gpu_pool))
    wait_condition(k8s, namespace, "kv", "ConfigValid", ("False", "NameConflict"))
    assert condition(tier(k8s, namespace, "kv"), "Ready") == ("False", "NameConflict")
    live = config_maps.get(name="kv-config", namespace=namespace).to_dict()
    assert live["data"] == {"mine": "yes"} and not live["metadata"].get("ownerReferences")
    assert daemonset(k8s, namespace, "kv") is None
    delete_and_collect(k8s, API, KIND, "kv", namespace)  # the garbage collector is done with the tier's dependents
    mine_now = get_or_none(k8s, "v1", "ConfigMap", "kv-config", namespace)
    assert mine_now is not None and mine_now.metadata.deletionTimestamp is None


def test_l1_larger_than_every_selected_node_is_reported(
    k8s: DynamicClient, operator: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    create_tier(k8s, namespace, tier_body("big", gpu_pool, l1={"size": "300Gi"}))
    wait_condition(k8s, namespace, "big", "ConfigValid", ("False", "L1ExceedsNodeMemory"))
    message = next(
        c["message"] for c in tier(k8s, namespace, "big")["status"]["conditions"] if c["type"] == "ConfigValid"
    )
    assert "256Gi" in message and "2 selected nodes" in message
    assert daemonset(k8s, namespace, "big") is None
    wait_for(
        lambda: any(
            e.reason == "L1ExceedsNodeMemory"
            for e in resource(k8s, "v1", "Event")
            .get(namespace=namespace, field_selector="involvedObject.name=big")
            .items
        ),
        timeout=30,
        what="a Warning event",
    )


def test_missing_secret_then_fixed_spec(
    k8s: DynamicClient, operator: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    create_tier(k8s, namespace, tier_body("kv", gpu_pool, auth={"secretRef": {"name": "missing"}}))
    wait_condition(k8s, namespace, "kv", "ConfigValid", ("False", "SecretNotFound"))
    resource(k8s, "v1", "Secret").create(
        namespace=namespace,
        body={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "token"}, "stringData": {"token": "s3cret"}},
    )
    resource(k8s, API, KIND).patch(
        body={"spec": {"auth": {"secretRef": {"name": "token"}}}},
        name="kv",
        namespace=namespace,
        content_type="application/merge-patch+json",
    )
    wait_condition(k8s, namespace, "kv", "ConfigValid", ("True", "Valid"))
    wait_for(lambda: daemonset(k8s, namespace, "kv"), timeout=30, what="DaemonSet once valid")


def test_a_node_socket_waits_for_its_csi_driver_then_reaches_the_daemonset(
    k8s: DynamicClient, operator: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    """No DaemonSet whose pods could only wait in ContainerCreating: first the condition says which driver to
    install, then an unfit one is named, then a fit one lets the servers mount the socket's directory."""
    driver = f"kv-{uuid.uuid4().hex[:8]}.test.strata.dev"
    drivers = resource(k8s, "storage.k8s.io/v1", "CSIDriver")

    def install(name: str, **spec: Any) -> None:
        drivers.create(
            body={
                "apiVersion": "storage.k8s.io/v1",
                "kind": "CSIDriver",
                "metadata": {"name": name},
                "spec": {"attachRequired": False, **spec},
            }
        )

    def use(name: str) -> None:
        resource(k8s, API, KIND).patch(
            body={"spec": {"nodeSocket": {"driver": name}}},
            name="kv",
            namespace=namespace,
            content_type="application/merge-patch+json",
        )

    create_tier(k8s, namespace, tier_body("kv", gpu_pool, nodeSocket={"enabled": True, "driver": driver}))
    try:
        wait_condition(k8s, namespace, "kv", "ConfigValid", ("False", "SocketDriverMissing"))
        assert daemonset(k8s, namespace, "kv") is None
        install(f"unfit-{driver}", podInfoOnMount=False, volumeLifecycleModes=["Ephemeral"])
        use(f"unfit-{driver}")
        wait_condition(k8s, namespace, "kv", "ConfigValid", ("False", "SocketDriverUnsuitable"))
        install(driver, podInfoOnMount=True, volumeLifecycleModes=["Ephemeral"])
        use(driver)
        wait_condition(k8s, namespace, "kv", "ConfigValid", ("True", "Valid"))
        found = wait_for(lambda: daemonset(k8s, namespace, "kv"), timeout=30, what="DaemonSet once valid")
        volumes = found.to_dict()["spec"]["template"]["spec"]["volumes"]
        assert {
            "name": "strata-kv-socket",
            "csi": {"driver": driver, "volumeAttributes": {"tier": "kv"}},
        } in volumes
    finally:
        for name in (driver, f"unfit-{driver}"):
            delete_quietly(k8s, "storage.k8s.io/v1", "CSIDriver", name, None)


def test_existing_claim_that_is_not_read_write_many_is_reported(
    k8s: DynamicClient, operator: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    resource(k8s, "v1", "PersistentVolumeClaim").create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": "local"},
            "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    create_tier(k8s, namespace, tier_body("kv", gpu_pool, l2={"fs": {"pvc": {"claimName": "local"}}}))
    wait_condition(k8s, namespace, "kv", "ConfigValid", ("False", "PVCNotReadWriteMany"))


def test_a_change_the_api_server_refuses_for_a_child_is_reported(
    k8s: DynamicClient, operator: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    create_tier(k8s, namespace, tier_body("kv", gpu_pool, l2={"fs": {"pvc": {"create": {"size": "2Gi"}}}}))
    wait_for(lambda: get_or_none(k8s, "v1", "PersistentVolumeClaim", "kv-l2", namespace), timeout=60, what="claim")
    wait_condition(k8s, namespace, "kv", "L2Reachable", ("False", "PVCNotBound"))  # no provisioner here
    resource(k8s, API, KIND).patch(
        body={"spec": {"l2": {"fs": {"pvc": {"create": {"size": "1Gi"}}}}}},
        name="kv",
        namespace=namespace,
        content_type="application/merge-patch+json",
    )
    wait_condition(k8s, namespace, "kv", "ConfigValid", ("False", "ChildRejected"))
    claim = resource(k8s, "v1", "PersistentVolumeClaim").get(name="kv-l2", namespace=namespace)
    assert claim.spec.resources.requests["storage"] == "2Gi"


def config_valid_message(k8s: DynamicClient, namespace: str, name: str) -> str:
    conditions = tier(k8s, namespace, name)["status"]["conditions"]
    return str(next(c["message"] for c in conditions if c["type"] == "ConfigValid"))


@pytest.mark.parametrize(
    ("name", "spec", "reason", "words"),
    [
        ("bad-resources", {"resources": {"limits": {"memory": "lots"}}}, "ResourcesInvalid", "'lots'"),
        ("bad-resources-key", {"resources": {"limit": {"cpu": "1"}}}, "ResourcesInvalid", "spec.resources.limit"),
        ("bad-affinity", {"affinity": {"nodeAffinity": "gpu"}}, "AffinityInvalid", "spec.affinity.nodeAffinity"),
        (
            "deep-affinity",
            {"affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": "gpu"}}},
            "ChildRejected",
            "DaemonSet deep-affinity",
        ),
        (
            "small-limit",
            {"l1": {"size": "2Gi"}, "resources": {"limits": {"memory": "1Gi"}}},
            "MemoryLimitBelowL1",
            "1Gi (1073741824 bytes) is below l1.size 2Gi (2147483648 bytes)",
        ),
    ],
)
def test_a_spec_the_servers_cannot_run_ends_in_a_condition_and_a_warning(
    k8s: DynamicClient,
    operator: Any,
    namespace: str,
    gpu_pool: dict[str, str],
    name: str,
    spec: dict[str, Any],
    reason: str,
    words: str,
) -> None:
    """These used to loop every 5 s with a traceback and no status (or were accepted with ConfigValid=True)."""
    create_tier(k8s, namespace, tier_body(name, gpu_pool, **spec))
    wait_condition(k8s, namespace, name, "ConfigValid", ("False", reason))
    assert words in config_valid_message(k8s, namespace, name)
    wait_for(lambda: (reason, config_valid_message(k8s, namespace, name)) in tier_warnings(k8s, namespace, name))
    # A reconcile of it returns (a condition), it does not raise into kopf's retry loop.
    outcome = reconciler.reconcile(tier(k8s, namespace, name))
    assert outcome is not None and not outcome.applied
    if reason != "ChildRejected":
        assert daemonset(k8s, namespace, name) is None


@pytest.mark.parametrize("name", ["k" * 64, "1kv", "kv.cache"])
def test_api_server_refuses_names_children_cannot_carry(
    k8s: DynamicClient, strata_crds: Any, namespace: str, name: str
) -> None:
    with pytest.raises(ApiException) as refused:
        create_tier(k8s, namespace, tier_body(name, {}))
    assert refused.value.status == 422 and "metadata.name must be" in refused.value.body


def test_a_tier_without_auth_gets_a_generated_token_that_is_never_rewritten(
    k8s: DynamicClient, operator: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    create_tier(k8s, namespace, tier_body("kv", gpu_pool))
    secret = wait_for(lambda: get_or_none(k8s, "v1", "Secret", "kv-kv-token", namespace), timeout=60, what="token")
    owner = tier(k8s, namespace, "kv")["metadata"]["uid"]
    assert [(o.kind, o.uid, o.controller) for o in secret.metadata.ownerReferences] == [("KVCacheTier", owner, True)]
    assert len(base64.b64decode(secret.data["token"])) >= 32 and secret.immutable
    ds = wait_for(lambda: daemonset(k8s, namespace, "kv"), timeout=60, what="DaemonSet")
    volume = next(v for v in ds.spec.template.spec.volumes if v.name == "auth")
    assert volume.secret.secretName == "kv-kv-token"
    connection = resource(k8s, "v1", "ConfigMap").get(name="kv-connection", namespace=namespace).data
    assert connection["STRATA_KV_AUTH_SECRET"] == "kv-kv-token"
    reconciler.reconcile(tier(k8s, namespace, "kv"))
    again = resource(k8s, "v1", "Secret").get(name="kv-kv-token", namespace=namespace)
    assert again.data["token"] == secret.data["token"]
    assert again.metadata.resourceVersion == secret.metadata.resourceVersion
    # Deleted by hand: a new token, and the servers roll to read it.
    before = daemonset(k8s, namespace, "kv").spec.template.metadata.annotations[CONFIG_HASH_ANNOTATION]
    resource(k8s, "v1", "Secret").delete(name="kv-kv-token", namespace=namespace)
    wait_for(lambda: get_or_none(k8s, "v1", "Secret", "kv-kv-token", namespace) is None, timeout=30, what="deleted")
    reconciler.reconcile(tier(k8s, namespace, "kv"))
    renewed = resource(k8s, "v1", "Secret").get(name="kv-kv-token", namespace=namespace)
    assert renewed.data["token"] != secret.data["token"]
    after = daemonset(k8s, namespace, "kv").spec.template.metadata.annotations[CONFIG_HASH_ANNOTATION]
    assert after != before


def test_a_users_secret_under_the_token_name_is_a_name_conflict(
    k8s: DynamicClient, operator: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    resource(k8s, "v1", "Secret").create(
        namespace=namespace,
        body={"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "kv-kv-token"}, "stringData": {"a": "b"}},
    )
    create_tier(k8s, namespace, tier_body("kv", gpu_pool))
    wait_condition(k8s, namespace, "kv", "ConfigValid", ("False", "NameConflict"))
    assert "auth.secretRef" in config_valid_message(k8s, namespace, "kv")
    mine = resource(k8s, "v1", "Secret").get(name="kv-kv-token", namespace=namespace)
    assert not mine.metadata.ownerReferences and base64.b64decode(mine.data["a"]) == b"b"
    assert daemonset(k8s, namespace, "kv") is None


def test_auth_disabled_creates_no_token(
    k8s: DynamicClient, operator: Any, namespace: str, gpu_pool: dict[str, str]
) -> None:
    create_tier(k8s, namespace, tier_body("open", gpu_pool, auth={"disabled": True}))
    ds = wait_for(lambda: daemonset(k8s, namespace, "open"), timeout=60, what="DaemonSet")
    assert not any(v.name == "auth" for v in ds.spec.template.spec.volumes)
    assert get_or_none(k8s, "v1", "Secret", "open-kv-token", namespace) is None
