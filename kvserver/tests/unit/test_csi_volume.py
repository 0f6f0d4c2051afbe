"""The CSI plugin's decisions without a cluster: which node directory a request gets, which requests are
refused (naming the attribute), which targets are accepted, mountinfo's escapes, which pods the API server's
objects make a tier's server (against the DaemonSet the operator's own builder renders), path resolution that
never follows a link; and the committed gRPC modules are exactly what hack/csi-protos.sh generates from the
.proto files."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from strata_kv.csi.mounts import _unescape, mount_point
from strata_kv.csi.volume import NodeDirectory, VolumeRequestError, check_target_path, node_directory

REPO = Path(__file__).resolve().parents[3]
POD = {
    "csi.storage.k8s.io/pod.namespace": "team-a",
    "csi.storage.k8s.io/ephemeral": "true",
    "csi.storage.k8s.io/pod.name": "p",
    "csi.storage.k8s.io/pod.uid": "u-1",
}


def test_the_directory_is_the_pods_namespace_and_the_tier():
    wanted = node_directory({**POD, "tier": "kv"})
    assert wanted == NodeDirectory("team-a", "kv", pod="p", pod_uid="u-1")
    assert wanted.path("/var/run/strata-kv") == "/var/run/strata-kv/team-a/kv"


@pytest.mark.parametrize(
    ("context", "attribute"),
    [
        ({**POD, "tier": "kv", "namespace": "team-b"}, "namespace"),
        ({"csi.storage.k8s.io/ephemeral": "true", "tier": "kv"}, "csi.storage.k8s.io/pod.namespace"),
        ({**POD, "csi.storage.k8s.io/ephemeral": "false", "tier": "kv"}, "csi.storage.k8s.io/ephemeral"),
        ({**POD}, "tier"),
        ({**POD, "tier": "a" * 64}, "tier"),
        ({**POD, "tier": "kv."}, "tier"),
        ({**POD, "tier": "kv\n"}, "tier"),  # a regex ending in `$` accepts a trailing newline
        ({**POD, "csi.storage.k8s.io/pod.namespace": "team-a\n", "tier": "kv"}, "csi.storage.k8s.io/pod.namespace"),
        ({**POD, "csi.storage.k8s.io/pod.namespace": "", "tier": "kv"}, "csi.storage.k8s.io/pod.namespace"),
        ({**POD, "csi.storage.k8s.io/pod.uid": "", "tier": "kv"}, "csi.storage.k8s.io/pod.uid"),
        ({**POD, "csi.storage.k8s.io/pod.name": "", "tier": "kv"}, "csi.storage.k8s.io/pod.name"),
        ({**POD, "csi.storage.k8s.io/pod.name": "P/../x", "tier": "kv"}, "csi.storage.k8s.io/pod.name"),
    ],
)
def test_refusals_name_the_attribute_to_change(context, attribute):
    with pytest.raises(VolumeRequestError) as refused:
        node_directory(context)
    assert refused.value.attribute == attribute and str(refused.value).startswith(f"{attribute}: ")


@given(st.text(max_size=80))
def test_whatever_tier_is_accepted_stays_one_path_component(tier):
    try:
        wanted = node_directory({**POD, "tier": tier})
    except VolumeRequestError:
        return
    path = wanted.path("/state")
    assert os.path.dirname(path) == "/state/team-a" and os.path.normpath(path) == path
    assert len(tier) <= 63 and tier not in (".", "..")
    assert tier.isascii() and tier.isprintable() and tier == tier.strip()


@pytest.mark.parametrize(
    "target",
    ["/k/pods/uid/volumes/kubernetes.io~csi/kv/mount", "/k/pods/uid/volumes/kubernetes.io~csi/kv/mount/"],
)
def test_targets_under_the_kubelets_pods_are_accepted(target):
    assert check_target_path(target, "/k") == "uid/volumes/kubernetes.io~csi/kv/mount"


@pytest.mark.parametrize(
    "target", ["", "relative/mount", "/k/pods", "/k/pods/../etc", "/etc", "/k/podsx/a", "/k/pods/a//b"]
)
def test_other_targets_are_refused(target):
    with pytest.raises(VolumeRequestError) as refused:
        check_target_path(target, "/k")
    assert refused.value.attribute == "target_path"


def test_mountinfo_escapes_are_read_back(tmp_path):
    assert _unescape(r"/a\040b\011c\134d") == "/a b\tc\\d"
    info = tmp_path / "mountinfo"
    info.write_text(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda rw\n"
        r"40 22 8:1 /s /k/pods/u/my\040vol ro,relatime - ext4 /dev/sda rw" + "\n"
    )
    assert mount_point("/k/pods/u/my vol", str(info)).read_only is True
    assert mount_point("/k/pods/u", str(info)) is None


def test_committed_grpc_modules_match_the_protos(tmp_path):
    """They are committed (the runtime image builds offline without protoc); regenerate with `make csi-protos`."""
    if shutil.which("bash") is None:
        pytest.fail("bash is needed to run hack/csi-protos.sh")
    subprocess.run(
        ["bash", str(REPO / "hack" / "csi-protos.sh"), str(tmp_path)],
        check=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    generated = sorted(p.name for p in (tmp_path / "strata_kv" / "csi").iterdir())
    suffixes = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")
    assert generated == sorted(f"{stem}{suffix}" for stem in ("csi", "pluginregistration") for suffix in suffixes)
    committed = REPO / "kvserver" / "strata_kv" / "csi"
    _, mismatch, errors = filecmp.cmpfiles(tmp_path / "strata_kv" / "csi", committed, generated, shallow=False)
    assert mismatch == errors == [], f"{mismatch + errors} differ from the .proto files: run `make csi-protos`"
