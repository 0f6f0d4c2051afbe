"""Which pods the objects the API server returns make a tier's server, checked against the DaemonSet the operator's
own builder renders and a pod made from it as the DaemonSet controller makes one; and path resolution below a
root that never follows a link (openat2, and the per-component walk an older kernel gets)."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest
from strata_kv.csi import fspath
from strata_kv.csi.identity import NotAdmitted, TierMissing, check_pod, check_server, check_tier
from strata_kv.csi.volume import NodeDirectory
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.kvcachetier.children import build_children
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.runtime_image import RuntimeImage

TIER_UID, DS_UID, POD_UID = "tier-uid", "ds-uid", "pod-uid"
WANTED = NodeDirectory("serving", "kv", pod="kv-x2b4c", pod_uid=POD_UID)


def _objects() -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """The tier, its DaemonSet as the operator renders it (and the API server stores it), and a pod the
    DaemonSet controller made from its template."""
    spec = KVCacheTierSpec.model_validate({"nodeSocket": {"enabled": True}})
    tier = {
        "apiVersion": "strata.dev/v1alpha1",
        "kind": "KVCacheTier",
        "metadata": {"name": "kv", "namespace": "serving", "uid": TIER_UID},
        "spec": {"nodeSocket": {"enabled": True, "driver": "kv.strata.dev"}},
    }
    daemonset = copy.deepcopy(
        build_children(spec, TierRef("kv", "serving", TIER_UID, 1), RuntimeImage("r:1")).daemonset
    )
    daemonset["metadata"]["uid"] = DS_UID
    template = daemonset["spec"]["template"]
    pod = {
        "metadata": {
            "name": "kv-x2b4c",
            "namespace": "serving",
            "uid": POD_UID,
            "labels": {**template["metadata"]["labels"], "controller-revision-hash": "5d8f"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "kv", "uid": DS_UID, "controller": True}
            ],
        },
        "spec": {**copy.deepcopy(template["spec"]), "nodeName": "node-1", "tolerations": [{"operator": "Exists"}]},
    }
    return tier, daemonset, pod


def test_the_daemonsets_pod_is_the_tiers_server():
    tier, daemonset, pod = _objects()
    check_pod(pod, WANTED, "node-1")
    check_tier(tier, WANTED)
    check_server(pod, daemonset, tier, WANTED)


def test_admission_may_add_what_does_not_reach_the_volume():
    tier, daemonset, pod = _objects()
    pod["spec"]["containers"][0]["resources"] = {"limits": {"cpu": "1"}}  # a LimitRange
    pod["spec"]["containers"].append({"name": "mesh-proxy", "image": "proxy:1"})  # a sidecar without the volume
    check_server(pod, daemonset, tier, WANTED)


def _forge(pod: dict[str, Any], change: str) -> None:
    server = pod["spec"]["containers"][0]
    if change == "image":
        server["image"] = "attacker:1"
    elif change == "command":
        server["command"] = ["sh", "-c", "nc -lU /run/strata-kv/kv.sock"]
    elif change == "env":
        server.setdefault("env", []).append({"name": "LD_PRELOAD", "value": "/tmp/x.so"})
    elif change == "mounts":
        server["volumeMounts"].append({"name": "extra", "mountPath": "/usr/lib"})
    elif change == "sidecar":
        pod["spec"]["containers"].append(
            {"name": "x", "image": "a:1", "volumeMounts": [{"name": "strata-kv-socket", "mountPath": "/s"}]}
        )
    elif change == "process-sharing":
        pod["spec"]["shareProcessNamespace"] = True
    elif change == "volume":
        next(v for v in pod["spec"]["volumes"] if "csi" in v)["csi"]["volumeAttributes"]["tier"] = "other"


@pytest.mark.parametrize(
    "change", ["image", "command", "env", "mounts", "sidecar", "process-sharing", "volume"]
)  # fmt: skip
def test_a_pod_with_the_daemonsets_owner_reference_but_its_own_code_is_not_the_server(change):
    """An ownerReference and labels are the pod author's to write: what runs with the volume must be the
    template's."""
    tier, daemonset, pod = _objects()
    _forge(pod, change)
    with pytest.raises(NotAdmitted, match="differs from DaemonSet kv's pod template"):
        check_server(pod, daemonset, tier, WANTED)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ("no-owner", "not controlled by a DaemonSet"),
        ("other-daemonset", "controlled by DaemonSet other"),
        ("stale-daemonset-uid", "that is not live"),
        ("daemonset-of-someone-else", "not controlled by KVCacheTier kv"),
        ("unlabelled-daemonset", "Strata's labels"),
        ("no-selector-labels", "selector labels"),
    ],
)
def test_the_chain_of_controllers_is_checked_against_the_live_objects(change, said):
    tier, daemonset, pod = _objects()
    ref = pod["metadata"]["ownerReferences"][0]
    if change == "no-owner":
        pod["metadata"]["ownerReferences"] = []
    elif change == "other-daemonset":
        ref["name"] = "other"
    elif change == "stale-daemonset-uid":
        ref["uid"] = "old"
    elif change == "daemonset-of-someone-else":
        daemonset["metadata"]["ownerReferences"][0]["uid"] = "another-tier"
    elif change == "unlabelled-daemonset":
        daemonset["metadata"]["labels"].pop("app.kubernetes.io/managed-by")
    else:
        pod["metadata"]["labels"] = {}
    with pytest.raises(NotAdmitted, match=said) as refused:
        check_server(pod, daemonset, tier, WANTED)
    assert str(refused.value).startswith("readOnly: false is only for KVCacheTier kv's server pods")


@pytest.mark.parametrize(
    ("pod_change", "node", "said"),
    [("gone", "node-1", "does not exist"), ("uid", "node-1", "has uid other"), (None, "node-2", "bound to node")],
)
def test_the_pod_is_the_kubelets_and_on_this_node(pod_change, node, said):
    _, _, pod = _objects()
    if pod_change == "uid":
        pod["metadata"]["uid"] = "other"
    with pytest.raises(NotAdmitted, match=said):
        check_pod(None if pod_change == "gone" else pod, WANTED, node)


@pytest.mark.parametrize(
    ("tier_spec", "said"),
    [
        (None, "does not exist"),
        ({}, "does not serve a node socket"),
        ({"nodeSocket": {"enabled": True, "driver": "sockets.example.com"}}, "through sockets.example.com"),
    ],
)
def test_only_an_existing_tier_serving_this_drivers_socket_gets_a_directory(tier_spec, said):
    tier = None if tier_spec is None else {"metadata": {"uid": TIER_UID}, "spec": tier_spec}
    with pytest.raises(TierMissing, match=said) as refused:
        check_tier(tier, WANTED)
    assert str(refused.value).startswith("tier: KVCacheTier serving/kv")


@pytest.fixture(params=["openat2", "walk"])
def resolution(request, monkeypatch):
    monkeypatch.setattr(fspath, "_have_openat2", request.param == "openat2")
    return request.param


@pytest.mark.parametrize("link", ["a", "a/b", "a/b/c"])
def test_no_component_below_the_root_may_be_a_link(tmp_path: Path, resolution, link):
    root, outside = tmp_path / "root", tmp_path / "outside"
    (outside / "b" / "c").mkdir(parents=True)
    (root / "a" / "b" / "c").mkdir(parents=True)
    real = root / link
    os.rename(real, tmp_path / "moved")
    real.symlink_to(outside / link.split("/", 1)[1] if "/" in link else outside)
    fd = fspath.open_root(str(root))
    try:
        with pytest.raises(fspath.LinkInPathError, match="symbolic link"):
            fspath.open_beneath(fd, "a/b/c")
    finally:
        os.close(fd)


def test_a_path_without_links_opens_to_that_directory(tmp_path: Path, resolution):
    (tmp_path / "a" / "b").mkdir(parents=True)
    root = fspath.open_root(str(tmp_path))
    try:
        opened = fspath.open_beneath(root, "a/b")
        try:
            assert os.path.samestat(os.fstat(opened), os.stat(tmp_path / "a" / "b"))
            assert os.readlink(fspath.fd_path(opened)) == str(tmp_path / "a" / "b")
        finally:
            os.close(opened)
        with pytest.raises(FileNotFoundError):
            fspath.open_beneath(root, "a/missing")
        with pytest.raises(fspath.LinkInPathError):
            fspath.open_beneath(root, "a/../../etc")
    finally:
        os.close(root)
