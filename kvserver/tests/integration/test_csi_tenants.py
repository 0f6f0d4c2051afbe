"""`strata-kv-csi` against hostile tenants, through the real plugin over gRPC with real bind mounts, asking the
real API server (the local control plane) who each pod is: what a pod can make the plugin create on the node,
what it can write there and what stays after it goes; who may get a tier's directory writable (a pod named like
the tier's server is not its server), whether a tenant pod can take the server's socket from the tier's
clients, whether one namespace can take every tier directory of the node, and whether a link under the kubelet's
pods directory can send a mount elsewhere."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from strata_testsupport.csi import CSICluster, mounts_under
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
    """A namespace with KVCacheTier `kv` and its server pod (the DaemonSet controller's)."""
    namespace = csi_cluster.namespace()
    csi_cluster.tier(namespace)
    return namespace, csi_cluster.server_pod(namespace, "kv")


def _node(plugin):
    from strata_kv.csi import csi_pb2_grpc

    return csi_pb2_grpc.NodeStub(grpc.insecure_channel(f"unix://{plugin.endpoint}"))


def _unpublish(node, target) -> None:
    from strata_kv.csi import csi_pb2

    node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id="csi-x", target_path=str(target)))


def _as(uid: int, groups: list[int], code: str, *args: str) -> str:
    """Run `code` in a process of `uid` with only `groups` (Debian's python3: the venv's interpreter lives under
    /root, which another user cannot enter); its stdout."""
    done = subprocess.run(
        ["/usr/bin/python3", "-c", code, *args],
        capture_output=True,
        text=True,
        user=uid,
        group=uid,
        extra_groups=groups,
        env={"PYTHONPATH": f"{REPO / 'kvserver'}:{REPO / 'units'}"},
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_made_up_tiers_are_refused_and_another_namespace_is_still_served(plugin, csi_cluster, tier_a):
    """The issue's measure: one namespace's pod asks for 255 tiers that do not exist (read-only, which the
    admission policy lets through); then another namespace's server and client publish on the same node."""
    node = _node(plugin)
    tenant_ns = csi_cluster.namespace()
    tenant = csi_cluster.pod(tenant_ns, "tenant-0")
    targets, refused = [], 0
    started = time.perf_counter()
    for i in range(255):
        target = plugin.target()
        try:
            node.NodePublishVolume(CSICluster.request(target, tenant, f"made-up-{i}", readonly=True))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.NOT_FOUND, error.details()
            assert error.details().startswith(f"tier: KVCacheTier {tenant_ns}/made-up-{i} does not exist")
            refused += 1
        targets.append(target)
    elapsed = time.perf_counter() - started
    left = [str(p) for p in plugin.state_dir.rglob("*")] if plugin.state_dir.exists() else []
    print(f"255 made-up tiers in {elapsed:.2f} s: {refused} refused, {len(left)} directories on the node")
    assert refused == 255, "no directory for a tier that does not exist"
    assert left == [] and mounts_under(plugin.root) == []

    namespace, server = tier_a
    server_dir, client_dir = plugin.target(), plugin.target()
    node.NodePublishVolume(CSICluster.request(server_dir, server, "kv"))
    node.NodePublishVolume(CSICluster.request(client_dir, csi_cluster.pod(namespace, "client"), "kv", readonly=True))
    assert (plugin.state_dir / namespace / "kv").is_dir()
    for target in (server_dir, client_dir, *targets):
        _unpublish(node, target)
    assert mounts_under(plugin.root) == []


def test_what_a_server_pod_may_write_is_bounded_and_goes_with_the_tiers_last_pod(plugin, csi_cluster, tier_a):
    """Even the tier's server writes into a small file system of its own, which is emptied when the server
    leaves (never when a client does) and gone with the tier's last pod on the node."""
    namespace, server_pod = tier_a
    node = _node(plugin)
    server, client, other = plugin.target(), plugin.target(), plugin.target()
    node.NodePublishVolume(CSICluster.request(server, server_pod, "kv"))
    node.NodePublishVolume(CSICluster.request(client, csi_cluster.pod(namespace, "client"), "kv", readonly=True))
    node.NodePublishVolume(CSICluster.request(other, csi_cluster.pod(namespace, "other"), "kv", readonly=True))
    with pytest.raises(OSError) as full:
        (server / "big").write_bytes(b"x" * (4 << 20))
    assert full.value.errno == errno.ENOSPC
    (server / "big").unlink()
    with pytest.raises(OSError) as full:
        for i in range(1000):
            (server / f"f{i}").touch()
    assert full.value.errno == errno.ENOSPC, "the inode count is bounded too"
    assert len(list(client.iterdir())) > 0, "the client sees what the server made"

    _unpublish(node, other)
    assert len(list(client.iterdir())) > 0, "a client's unpublish never empties the directory"
    _unpublish(node, server)
    assert list(client.iterdir()) == [], "the server's unpublish empties the directory; the client keeps it"
    assert (plugin.state_dir / namespace / "kv").is_dir()
    _unpublish(node, client)
    assert not (plugin.state_dir / namespace).exists(), "the tier's last unpublish removes its directory"
    assert mounts_under(plugin.root) == []


def test_tier_directories_are_bounded_on_the_node_and_for_each_namespace(csi_cluster):
    """Real tiers: namespace A holds its share (2) and is refused a third; B still gets one, until the node's
    bound (3) is reached; one that goes makes room."""
    a, b = csi_cluster.namespace(), csi_cluster.namespace()
    for namespace, tiers in ((a, ("t0", "t1", "t2")), (b, ("u0", "u1"))):
        for tier in tiers:
            csi_cluster.tier(namespace, tier)
    client_a, client_b = csi_cluster.pod(a, "client"), csi_cluster.pod(b, "client")
    with csi_cluster.plugin("--max-tier-dirs", "3", "--max-tier-dirs-per-namespace", "2") as small:
        node = _node(small)
        held = [small.target() for _ in range(2)]
        for target, tier in zip(held, ("t0", "t1"), strict=True):
            node.NodePublishVolume(CSICluster.request(target, client_a, tier, readonly=True))
        with pytest.raises(grpc.RpcError) as share:
            node.NodePublishVolume(CSICluster.request(small.target(), client_a, "t2", readonly=True))
        assert share.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-tier-dirs-per-namespace 2" in share.value.details(), share.value.details()
        node.NodePublishVolume(CSICluster.request(small.target(), client_a, "t0", readonly=True))  # one it holds
        node.NodePublishVolume(CSICluster.request(small.target(), client_b, "u0", readonly=True))
        with pytest.raises(grpc.RpcError) as full:
            node.NodePublishVolume(CSICluster.request(small.target(), client_b, "u1", readonly=True))
        assert full.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-tier-dirs 3" in full.value.details(), full.value.details()
        _unpublish(node, held[1])  # t1's only pod goes: room for one more
        node.NodePublishVolume(CSICluster.request(small.target(), client_b, "u1", readonly=True))


# A tenant's pod holding the socket group tries what the attacker did: unlink the server's socket and
# bind its own listener in its place.
TAKE_THE_SOCKET = """
import os, socket, sys
path = os.path.join(sys.argv[1], "kv.sock")
out = []
try:
    os.unlink(path)
    out.append("unlinked")
except OSError as error:
    out.append(error.strerror)
for name in ("kv.sock", "evil.sock"):  # in its place, or anywhere else in the directory
    listener = socket.socket(socket.AF_UNIX)
    try:
        listener.bind(os.path.join(sys.argv[1], name))
        out.append("bound")
    except OSError as error:
        out.append(error.strerror)
print(",".join(out))
"""

CLIENT = """
import sys
from strata_kv.client import KVClient
with KVClient(unix_socket=sys.argv[1], token=sys.argv[2], timeout=20) as kv:
    kv.set(b"k", b"from-the-client")
    print(kv.get(b"k").decode())
"""


@pytest.mark.parametrize("name", ["kv-ttrn7", "kv-x2b4c", "tenant-0", "kv"])
def test_a_pod_named_like_the_tiers_server_gets_nothing_writable(plugin, csi_cluster, tier_a, name):
    """The issue's attack: a tenant names its pod as the tier's DaemonSet names its own. The API server says
    whose pod it is: no DaemonSet of the tier controls it, so it is refused the directory writable."""
    namespace, _ = tier_a
    tenant = csi_cluster.pod(namespace, name)
    node = _node(plugin)
    target = plugin.target()
    with pytest.raises(grpc.RpcError) as refused:
        node.NodePublishVolume(CSICluster.request(target, tenant, "kv"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details().startswith("readOnly: false is only for KVCacheTier kv's server pods")
    assert "not controlled by a DaemonSet" in refused.value.details(), refused.value.details()
    assert mounts_under(plugin.root) == [] and not plugin.state_dir.exists()


def test_the_kubelets_word_for_the_pod_must_match_the_api_servers(plugin, csi_cluster, tier_a):
    """A request naming the server pod with another uid (a pod deleted and made again under the same name, or a
    made-up request) and one for a pod that does not exist are refused."""
    namespace, server = tier_a
    node = _node(plugin)
    for request, said in (
        (CSICluster.request(plugin.target(), {**server, "metadata": {**server["metadata"], "uid": "0"}}, "kv"), "uid"),
        (CSICluster.request(plugin.target(), {"metadata": {"namespace": namespace, "name": "gone", "uid": "1"}}, "kv"),
         "does not exist"),
    ):  # fmt: skip
        with pytest.raises(grpc.RpcError) as refused:
            node.NodePublishVolume(request)
        assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert said in refused.value.details(), refused.value.details()
    assert mounts_under(plugin.root) == []


def test_a_tenant_pod_cannot_take_the_tiers_socket(plugin, csi_cluster, tier_a, tmp_path):
    """The issue's attack to its end: a pod named `kv-ttrn7` is refused the directory writable, cannot unlink or
    replace the server's socket through its read-only one, and when it goes the socket stays: the next client
    still reaches the real server with its token."""
    namespace, server_pod = tier_a
    node = _node(plugin)
    server, attacker, client = plugin.target(), plugin.target(), plugin.target()
    tenant = csi_cluster.pod(namespace, "kv-ttrn7")
    node.NodePublishVolume(CSICluster.request(server, server_pod, "kv"))
    with pytest.raises(grpc.RpcError) as refused:
        node.NodePublishVolume(CSICluster.request(attacker, tenant, "kv"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    node.NodePublishVolume(CSICluster.request(attacker, tenant, "kv", readonly=True))
    node.NodePublishVolume(CSICluster.request(client, csi_cluster.pod(namespace, "client"), "kv", readonly=True))
    token = "t0ken-for-the-tier"
    (tmp_path / "token").write_text(token)
    config = {"listen": {"unix_socket": str(server / "kv.sock")}, "auth": {"token_file": str(tmp_path / "token")}}
    with running_kv_server(tmp_path / "kv", config, l2_fs=False):
        tried = _as(1000, [SOCKET_GROUP], TAKE_THE_SOCKET, str(attacker)).strip()
        assert tried == "Read-only file system,Address already in use,Read-only file system", tried
        _unpublish(node, attacker)  # the tenant's pod goes
        assert (client / "kv.sock").is_socket(), "a client's unpublish leaves the server's socket"
        reached = _as(1000, [SOCKET_GROUP], CLIENT, str(client / "kv.sock"), token).strip()
        assert reached == "from-the-client", "the client reached the real server"


def test_a_restarted_plugin_tears_down_what_the_last_one_mounted(plugin, csi_cluster, tier_a):
    """The plugin keeps no state but the mount table, so a restart between publish and unpublish still
    leaves nothing behind."""
    namespace, server_pod = tier_a
    client_pod = csi_cluster.pod(namespace, "client")
    node = _node(plugin)
    server, client = plugin.target(), plugin.target()
    node.NodePublishVolume(CSICluster.request(server, server_pod, "kv"))
    node.NodePublishVolume(CSICluster.request(client, client_pod, "kv", readonly=True))
    (server / "kv.sock").write_bytes(b"")
    assert plugin.stop() == 0
    plugin.start()
    node = _node(plugin)
    node.NodePublishVolume(CSICluster.request(plugin.target(), client_pod, "kv", readonly=True))
    assert (plugin.state_dir / namespace / "kv" / "kv.sock").exists(), "the same directory, not a new one"
    for target in (server, client, *plugin.kubelet_dir.glob("pods/*/volumes/*/*/mount")):
        _unpublish(node, target)
    assert not (plugin.state_dir / namespace).exists() and mounts_under(plugin.root) == []


def _linked(plugin, tmp_path, where: str) -> tuple[Path, Path]:
    """A target whose component `where` (`pod`, `volumes` or `mount`) is a link to a directory outside the
    kubelet's pods directory, laid out so that following the link would reach a directory to mount on."""
    outside = tmp_path / "outside"
    (outside / "volumes" / "kubernetes.io~csi" / "kv" / "mount").mkdir(parents=True)
    pod = plugin.kubelet_dir / "pods" / os.urandom(4).hex()
    if where == "pod":
        pod.parent.mkdir(parents=True, exist_ok=True)
        pod.symlink_to(outside)
    elif where == "volumes":
        pod.mkdir(parents=True)
        (pod / "volumes").symlink_to(outside / "volumes")
    else:
        (pod / "volumes" / "kubernetes.io~csi" / "kv").mkdir(parents=True)
        (pod / "volumes" / "kubernetes.io~csi" / "kv" / "mount").symlink_to(
            outside / "volumes" / "kubernetes.io~csi" / "kv" / "mount"
        )
    return pod / "volumes" / "kubernetes.io~csi" / "kv" / "mount", outside


@pytest.mark.parametrize("where", ["pod", "volumes", "mount"])
def test_a_link_under_the_pods_directory_is_never_followed(plugin, tier_a, tmp_path, where):
    """The issue's attack: a directory under <kubelet>/pods that is a link. The server's (writable) publish
    through it is refused naming the target, nothing is mounted outside, and unpublish follows no link either
    (a link in the target's place is removed, not what it points to)."""
    _, server = tier_a
    node = _node(plugin)
    target, outside = _linked(plugin, tmp_path, where)
    with pytest.raises(grpc.RpcError) as refused:
        node.NodePublishVolume(CSICluster.request(target, server, "kv"))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details().startswith("target_path:") and "symbolic link" in refused.value.details()
    assert mounts_under(tmp_path) == [] and mounts_under(plugin.root) == []
    assert not plugin.state_dir.exists() or not any(plugin.state_dir.iterdir()), "no tier directory stays"
    if where == "mount":
        _unpublish(node, target)
        assert not target.is_symlink(), "the link in the target's place is gone"
    else:
        with pytest.raises(grpc.RpcError) as refused:
            _unpublish(node, target)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (outside / "volumes" / "kubernetes.io~csi" / "kv" / "mount").is_dir(), "what the link names is untouched"
    assert mounts_under(tmp_path) == []
