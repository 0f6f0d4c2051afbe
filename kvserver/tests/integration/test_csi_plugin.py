"""`strata-kv-csi` as a real process, spoken to by real gRPC clients the way a kubelet does (the requests carry
what a kubelet sends for an inline `csi` volume; the kubelet itself runs in the real-node tier): published
directories are real bind mounts, a real `strata-kv` serves on a socket in one of them and a client reaches it
through another, as a non-root user holding only the socket's group; namespaces never share a directory;
hostile attributes are refused naming the attribute; publish and unpublish are idempotent; the kubelet's
registration socket answers GetInfo with the endpoint that serves CSI. The pods and tiers the requests name are
real objects of the local control plane (`csi_cluster`), which the plugin asks as the chart's service account."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import grpc
import pytest
from strata_testsupport.csi import CSICluster, mounts_under, publish_request
from strata_testsupport.kvserver import running_kv_server

pytestmark = pytest.mark.integration

SOCKET_GROUP = 65532
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def plugin(csi_cluster: CSICluster):
    with csi_cluster.plugin() as running:
        yield running


@pytest.fixture
def tier_a(csi_cluster: CSICluster):
    """A namespace with KVCacheTier `kv`: its server pod (the DaemonSet controller's) and a client pod."""
    namespace = csi_cluster.namespace()
    csi_cluster.tier(namespace)
    return namespace, csi_cluster.server_pod(namespace, "kv"), csi_cluster.pod(namespace, "client")


def _stubs(plugin):
    from strata_kv.csi import csi_pb2_grpc

    channel = grpc.insecure_channel(f"unix://{plugin.endpoint}")
    return csi_pb2_grpc.IdentityStub(channel), csi_pb2_grpc.NodeStub(channel)


def _unpublish(node, target) -> None:
    from strata_kv.csi import csi_pb2

    node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id="csi-x", target_path=str(target)))


def _client_as(uid: int, groups: list[int], socket: Path, value_seed: bytes) -> subprocess.CompletedProcess[str]:
    """SET and GET through `socket` in a process of `uid` with only `groups` (Debian's python3: the venv's
    interpreter lives under /root, which another user cannot enter); prints the digest of what GET returned."""
    code = (
        "import hashlib, sys\n"
        "from strata_kv.client import KVClient\n"
        "seed = sys.argv[2].encode()\n"
        "value = b''.join(hashlib.sha256(seed + i.to_bytes(4, 'big')).digest() for i in range(65536))\n"
        "with KVClient(unix_socket=sys.argv[1], timeout=20) as kv:\n"
        "    kv.set(b'chunk-' + seed, value)\n"
        "    print(hashlib.sha256(kv.get(b'chunk-' + seed) or b'').hexdigest())\n"
    )
    return subprocess.run(
        ["/usr/bin/python3", "-c", code, str(socket), value_seed.decode()],
        capture_output=True,
        text=True,
        user=uid,
        group=uid,
        extra_groups=groups,
        env={"PYTHONPATH": f"{REPO / 'kvserver'}:{REPO / 'units'}"},
        timeout=60,
    )


def _expected_digest(seed: bytes) -> str:
    value = b"".join(hashlib.sha256(seed + i.to_bytes(4, "big")).digest() for i in range(65536))  # 2 MiB
    return hashlib.sha256(value).hexdigest()


def test_identity_and_node_info_answer_like_a_csi_node_plugin(plugin):
    from strata_kv.csi import csi_pb2

    identity, node = _stubs(plugin)
    info = identity.GetPluginInfo(csi_pb2.GetPluginInfoRequest())
    assert info.name == "kv.strata.dev" and info.vendor_version
    assert identity.Probe(csi_pb2.ProbeRequest()).ready.value is True
    assert list(identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest()).capabilities) == []
    assert list(node.NodeGetCapabilities(csi_pb2.NodeGetCapabilitiesRequest()).capabilities) == []
    assert node.NodeGetInfo(csi_pb2.NodeGetInfoRequest()).node_id == plugin.node_id


def test_a_server_in_one_published_directory_serves_a_client_through_another(plugin, tier_a, tmp_path):
    namespace, server, client = tier_a
    _, node = _stubs(plugin)
    server_dir, client_dir = plugin.target(), plugin.target()
    node.NodePublishVolume(CSICluster.request(server_dir, server, "kv"))
    node.NodePublishVolume(CSICluster.request(client_dir, client, "kv", readonly=True))

    shared = plugin.state_dir / namespace / "kv"
    info = shared.stat()
    assert (info.st_uid, info.st_gid, oct(info.st_mode & 0o7777)) == (0, SOCKET_GROUP, oct(0o2770))
    config = {"listen": {"unix_socket": str(server_dir / "kv.sock")}}
    with running_kv_server(tmp_path / "kv", config, l2_fs=False):
        assert (client_dir / "kv.sock").exists(), "the client's mount shows the server's socket"
        assert (client_dir / "kv.sock").stat().st_gid == SOCKET_GROUP, "the setgid directory gave it its group"
        # A read-only mount still lets a client connect (connect(2) on a socket is not a write to the mount).
        member = _client_as(1000, [SOCKET_GROUP], client_dir / "kv.sock", b"one")
        assert member.returncode == 0, member.stderr
        assert member.stdout.strip() == _expected_digest(b"one"), "GET returned the bytes SET wrote"
        stranger = _client_as(1000, [], client_dir / "kv.sock", b"two")
        assert stranger.returncode != 0 and "Permission denied" in stranger.stderr, stranger.stderr
        with pytest.raises(OSError, match="Read-only file system"):
            (client_dir / "other.sock").write_bytes(b"")


def test_another_namespace_gets_another_directory(plugin, tier_a, csi_cluster, tmp_path):
    namespace, server, _ = tier_a
    other = csi_cluster.namespace()
    csi_cluster.tier(other)
    _, node = _stubs(plugin)
    mine, theirs = plugin.target(), plugin.target()
    node.NodePublishVolume(CSICluster.request(mine, server, "kv"))
    node.NodePublishVolume(CSICluster.request(theirs, csi_cluster.pod(other, "client"), "kv", readonly=True))
    with running_kv_server(tmp_path / "kv", {"listen": {"unix_socket": str(mine / "kv.sock")}}, l2_fs=False):
        assert (mine / "kv.sock").exists()
        assert not (theirs / "kv.sock").exists() and list(theirs.iterdir()) == []
    assert sorted(os.listdir(plugin.state_dir)) == sorted([namespace, other])


@pytest.mark.parametrize(
    ("namespace", "tier", "attributes", "named"),
    [
        ("a", "..", {}, "tier"),
        ("a", "a/b", {}, "tier"),
        ("a", "", {}, "tier"),
        ("a", "k" * 300, {}, "tier"),
        ("a", "KV", {}, "tier"),
        ("a", "-kv", {}, "tier"),
        ("a", "kv\n", {}, "tier"),
        ("a", None, {}, "tier"),
        ("a", "kv", {"namespace": "b"}, "namespace"),
        ("a", "kv", {"path": "/etc"}, "path"),
        (None, "kv", {}, "csi.storage.k8s.io/pod.namespace"),
        ("..", "kv", {}, "csi.storage.k8s.io/pod.namespace"),
    ],
    ids=["dotdot", "slash", "empty", "300-chars", "upper", "leading-dash", "newline", "no-tier", "namespace-attr",
         "path-attr", "no-pod-namespace", "dotdot-namespace"],
)  # fmt: skip
def test_hostile_requests_are_refused_naming_the_attribute(plugin, namespace, tier, attributes, named):
    _, node = _stubs(plugin)
    target = plugin.target()
    with pytest.raises(grpc.RpcError) as refused:
        node.NodePublishVolume(publish_request(target, namespace, tier, attributes=attributes))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith(f"{named}:"), refused.value.details()
    assert mounts_under(plugin.root) == [] and not target.exists()
    assert not plugin.state_dir.exists(), "a refused request creates no directory"


def test_persistent_volumes_and_targets_outside_the_kubelets_pods_are_refused(plugin, tmp_path):
    _, node = _stubs(plugin)
    for request, named in (
        (publish_request(plugin.target(), "a", "kv", ephemeral=False), "csi.storage.k8s.io/ephemeral"),
        (publish_request(tmp_path / "elsewhere", "a", "kv"), "target_path"),
        (publish_request(f"{plugin.kubelet_dir}/pods/../../../etc", "a", "kv"), "target_path"),
    ):
        with pytest.raises(grpc.RpcError) as refused:
            node.NodePublishVolume(request)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith(f"{named}:"), refused.value.details()
    assert mounts_under(plugin.root) == [] and not (tmp_path / "elsewhere").exists()


def test_publish_and_unpublish_are_idempotent(plugin, tier_a, csi_cluster):
    from strata_kv.csi.mounts import mount_point

    namespace, server, client = tier_a
    csi_cluster.tier(namespace, "other")
    _, node = _stubs(plugin)
    target = plugin.target()
    node.NodePublishVolume(CSICluster.request(target, server, "kv"))
    node.NodePublishVolume(CSICluster.request(target, server, "kv"))  # the kubelet retrying
    assert mounts_under(plugin.root) == [str(plugin.state_dir / namespace / "kv"), str(target)]  # the tier's tmpfs
    published = mount_point(str(target))
    assert published is not None and {"nosuid", "nodev", "noexec"} <= published.options, published
    assert not published.read_only
    with pytest.raises(grpc.RpcError) as clash:
        node.NodePublishVolume(CSICluster.request(target, client, "other", readonly=True))
    assert clash.value.code() == grpc.StatusCode.ALREADY_EXISTS
    assert not (plugin.state_dir / namespace / "other").exists(), "a failed publish leaves no directory"
    with pytest.raises(grpc.RpcError) as clash:
        node.NodePublishVolume(CSICluster.request(target, server, "kv", readonly=True))
    assert clash.value.code() == grpc.StatusCode.ALREADY_EXISTS

    _unpublish(node, target)
    assert mount_point(str(target)) is None and not target.exists()
    _unpublish(node, target)  # again: nothing left to do is success
    _unpublish(node, plugin.target())  # a target that was never published
    assert mounts_under(plugin.root) == []
    assert not (plugin.state_dir / namespace).exists(), "the tier's last unpublish removes its directory"


def test_the_kubelet_registration_socket_names_the_csi_endpoint(plugin):
    from strata_kv.csi import csi_pb2, csi_pb2_grpc, pluginregistration_pb2, pluginregistration_pb2_grpc

    registration = pluginregistration_pb2_grpc.RegistrationStub(
        grpc.insecure_channel(f"unix://{plugin.registration_socket}")
    )
    info = registration.GetInfo(pluginregistration_pb2.InfoRequest())
    assert (info.type, info.name, info.endpoint) == ("CSIPlugin", "kv.strata.dev", str(plugin.endpoint))
    assert list(info.supported_versions) == ["1.0.0"]
    # What the kubelet does next: call the endpoint it was given, then report the outcome.
    endpoint = csi_pb2_grpc.IdentityStub(grpc.insecure_channel(f"unix://{info.endpoint}"))
    assert endpoint.GetPluginInfo(csi_pb2.GetPluginInfoRequest()).name == info.name
    registration.NotifyRegistrationStatus(pluginregistration_pb2.RegistrationStatus(plugin_registered=True))
    registration.NotifyRegistrationStatus(
        pluginregistration_pb2.RegistrationStatus(plugin_registered=False, error="version 9 unsupported")
    )
    assert "did not register kv.strata.dev: version 9 unsupported" in plugin.log()


def test_stopping_removes_both_sockets(plugin):
    assert plugin.endpoint.is_socket() and plugin.registration_socket.is_socket()
    assert plugin.stop() == 0
    assert not plugin.endpoint.exists() and not plugin.registration_socket.exists()


def test_serve_needs_a_node_id():
    result = subprocess.run(
        [sys.executable, "-m", "strata_kv.csi.cli", "serve"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "NODE_NAME"},
    )
    assert result.returncode != 0 and "--node-id (or $NODE_NAME) is required" in result.stderr
