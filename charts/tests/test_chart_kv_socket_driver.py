"""`kvSocketDriver`: the chart's opt-in CSI node plugin kv.strata.dev (strata-kv-csi from the runtime image),
rendered by the real Helm CLI: nothing by default; when on, the CSIDriver the plugin's security rests on, a
privileged node DaemonSet pointed at the configured kubelet and state directories, and its service account,
which may only `get` pods, DaemonSets and KVCacheTiers (who a pod is, and which tier it serves)."""

from __future__ import annotations

import pytest

ON = {"kvSocketDriver": {"enabled": True}}


def test_off_by_default(helm):
    objects = helm.template()
    assert not [o for o in objects if o["kind"] == "CSIDriver" or "kv-socket-driver" in o["metadata"]["name"]]


def test_the_csidriver_passes_pod_info_and_serves_inline_volumes_only(helm, chart_helpers):
    driver = chart_helpers.find(helm.template(ON), "CSIDriver")
    assert driver["metadata"]["name"] == "kv.strata.dev"
    assert driver["spec"] == {
        "attachRequired": False,
        "podInfoOnMount": True,  # the plugin takes the namespace from csi.storage.k8s.io/pod.namespace only
        "volumeLifecycleModes": ["Ephemeral"],
        "fsGroupPolicy": "None",  # one directory for many pods: no per-pod chown
        "requiresRepublish": False,
        "storageCapacity": False,
    }


def test_the_node_plugin_mounts_the_kubelet_dir_bidirectionally_and_reads_only_what_it_checks(helm, chart_helpers):
    objects = helm.template(ON)
    daemonset = chart_helpers.find(objects, "DaemonSet")
    assert daemonset["metadata"]["namespace"] == "strata-system"
    pod = daemonset["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert pod["automountServiceAccountToken"] is True
    assert pod["serviceAccountName"] == "strata-kv-socket-driver"
    assert container["image"] == "ghcr.io/strata-dev/strata-runtime:0.1.0"
    assert container["command"] == [
        "strata-kv-csi",
        "serve",
        "--kubelet-dir=/var/lib/kubelet",
        "--state-dir=/var/run/strata-kv",
        "--socket-group=65532",
        "--tier-dir-bytes=65536",
        "--tier-dir-inodes=16",
        "--max-tier-dirs=256",
        "--max-tier-dirs-per-namespace=16",
    ]
    assert container["securityContext"]["privileged"] is True and container["securityContext"]["runAsUser"] == 0
    assert container["env"] == [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["kubelet-dir"] == {
        "name": "kubelet-dir",
        "mountPath": "/var/lib/kubelet",
        "mountPropagation": "Bidirectional",
    }
    # The tier directories' tmpfs mounts are the host's: pods keep sharing them across a plugin restart.
    assert mounts["state-dir"]["mountPropagation"] == "Bidirectional"
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"]}
    assert volumes == {
        "kubelet-dir": {"path": "/var/lib/kubelet", "type": "Directory"},
        "state-dir": {"path": "/var/run/strata-kv", "type": "DirectoryOrCreate"},
    }
    assert pod["tolerations"] == [{"operator": "Exists"}]
    # Its own service account and ClusterRole, nothing more: GET of single objects, no list, watch or write.
    kinds = ("ClusterRole", "Role", "ServiceAccount", "ClusterRoleBinding", "RoleBinding")
    added = sorted(
        (o["kind"], o["metadata"]["name"]) for o in objects if o["kind"] in kinds and o not in helm.template()
    )
    assert added == [
        ("ClusterRole", "strata-kv-socket-driver"),
        ("ClusterRoleBinding", "strata-kv-socket-driver"),
        ("ServiceAccount", "strata-kv-socket-driver"),
    ]
    role = chart_helpers.find(objects, "ClusterRole", "strata-kv-socket-driver")
    assert role["rules"] == [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]},
        {"apiGroups": ["apps"], "resources": ["daemonsets"], "verbs": ["get"]},
        {"apiGroups": ["strata.dev"], "resources": ["kvcachetiers"], "verbs": ["get"]},
    ]
    binding = chart_helpers.find(objects, "ClusterRoleBinding", "strata-kv-socket-driver")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "strata-kv-socket-driver", "namespace": "strata-system"}
    ]


def test_directories_and_group_are_configurable(helm, chart_helpers):
    values = {
        "kvSocketDriver": {
            "enabled": True,
            "kubeletDir": "/var/lib/strata-node/kubelet/",
            "stateDir": "/srv/kv",
            "socketGroup": 2000,
            "tierDirBytes": 8192,
            "tierDirInodes": 4,
            "maxTierDirs": 10,
            "maxTierDirsPerNamespace": 3,
            "tolerations": [],
            "nodeSelector": {"nvidia.com/gpu.present": "true"},
        }
    }
    pod = chart_helpers.find(helm.template(values), "DaemonSet")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["command"][2:] == [
        "--kubelet-dir=/var/lib/strata-node/kubelet",
        "--state-dir=/srv/kv",
        "--socket-group=2000",
        "--tier-dir-bytes=8192",
        "--tier-dir-inodes=4",
        "--max-tier-dirs=10",
        "--max-tier-dirs-per-namespace=3",
    ]
    assert container["volumeMounts"][0]["mountPath"] == "/var/lib/strata-node/kubelet"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and "tolerations" not in pod


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"kubeletDir": "var/lib/kubelet"}, "kubeletDir"),
        ({"stateDir": ""}, "stateDir"),
        ({"socketGroup": -1}, "socketGroup"),
        ({"tierDirBytes": 0}, "tierDirBytes"),
        ({"maxTierDirs": 0}, "maxTierDirs"),
        ({"maxTierDirsPerNamespace": 0}, "maxTierDirsPerNamespace"),
        ({"enabled": "yes"}, "enabled"),
        ({"socketDir": "/x"}, "socketDir"),
    ],
)
def test_schema_rejects_wrong_values(helm, values, complaint):
    result = helm.template_raw({"kvSocketDriver": values})
    assert result.returncode != 0, f"{values} was accepted"
    assert complaint in result.stderr


def test_lint_passes_with_the_driver_on(helm, chart_helpers):
    helm.run("lint", "--strict", str(chart_helpers.chart), "--values", str(helm.values_file(ON)))
