"""`strata-kv-csi` against hostile tenants, through the real plugin over gRPC with real bind mounts: what a pod
can make the plugin create on the node, what it can write there and what stays after it goes; who may get a
tier's directory writable, and whether a tenant pod can take the server's socket from the tier's clients."""

from __future__ import annotations

import errno
import os
import subprocess
import time
from pathlib import Path

import grpc
import pytest
from strata_testsupport.csi import mounts_under, publish_request, running_csi_plugin, server_pod
from strata_testsupport.kvserver import running_kv_server

pytestmark = pytest.mark.integration

SOCKET_GROUP = 65532
REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def root():
    if os.geteuid() != 0:
        pytest.skip("bind mounts need root")  # the machine's CI runs as root: never skipped there


@pytest.fixture
def plugin(root):
    with running_csi_plugin() as running:
        yield running


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


# A tenant's pod (uid 65532, allowed under restricted) writes 1 MiB into each directory it was given.
WRITE_EVERYWHERE = """
import os, sys
written = 0
for target in sys.argv[1:]:
    try:
        with open(os.path.join(target, "fill"), "wb") as f:
            f.write(b"x" * (1 << 20))
        written += 1
    except OSError as error:
        pass
print(written)
"""


def test_made_up_tiers_leave_nothing_on_the_node(plugin):
    """The issue's measure: a pod names 100 tiers that do not exist, asking for each read-write as the attack
    did; it is refused that, takes read-only volumes instead, writes into all of them as uid 65532 and goes.
    Nothing it wrote and no directory it caused stays."""
    node = _node(plugin)
    targets, refused = [], 0
    started = time.perf_counter()
    for i in range(100):
        target = plugin.target()
        try:
            node.NodePublishVolume(publish_request(target, "a", f"made-up-{i}", pod="tenant-0"))
        except grpc.RpcError as error:
            assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
            assert error.details().startswith("readOnly:"), error.details()
            refused += 1
            node.NodePublishVolume(publish_request(target, "a", f"made-up-{i}", pod="tenant-0", readonly=True))
        targets.append(target)
    elapsed = time.perf_counter() - started
    written = int(_as(SOCKET_GROUP, [SOCKET_GROUP], WRITE_EVERYWHERE, *map(str, targets)))
    for target in targets:
        _unpublish(node, target)
    left = [str(p) for p in plugin.state_dir.rglob("*")] if plugin.state_dir.exists() else []
    print(f"100 made-up tiers in {elapsed:.2f} s: {refused} read-write refused, {written} written, {len(left)} left")
    assert refused == 100, "only a tier's server pod gets its directory writable"
    assert written == 0, "a read-only volume takes no bytes"
    assert left == [], f"nothing stays on the node after the pod goes: {left[:5]}"
    assert mounts_under(plugin.root) == []


def test_what_a_server_pod_may_write_is_bounded_and_goes_with_the_tiers_last_pod(plugin):
    """Even the tier's server (or a pod posing as one) writes into a small file system of its own, which is
    emptied when the server leaves and gone with the tier's last pod on the node."""
    node = _node(plugin)
    server, client = plugin.target(), plugin.target()
    node.NodePublishVolume(publish_request(server, "a", "kv", pod=server_pod("kv")))
    node.NodePublishVolume(publish_request(client, "a", "kv", readonly=True))
    with pytest.raises(OSError) as full:
        (server / "big").write_bytes(b"x" * (4 << 20))
    assert full.value.errno == errno.ENOSPC
    (server / "big").unlink()
    with pytest.raises(OSError) as full:
        for i in range(1000):
            (server / f"f{i}").touch()
    assert full.value.errno == errno.ENOSPC, "the inode count is bounded too"
    assert len(list(client.iterdir())) > 0, "the client sees what the server made"

    _unpublish(node, server)
    assert list(client.iterdir()) == [], "the server's unpublish empties the directory; the client keeps it"
    assert (plugin.state_dir / "a" / "kv").is_dir()
    _unpublish(node, client)
    assert not (plugin.state_dir / "a").exists(), "the tier's last unpublish removes its directory"
    assert mounts_under(plugin.root) == []


def test_the_number_of_tier_directories_is_bounded(root):
    with running_csi_plugin("--max-tier-dirs", "3") as small:
        node = _node(small)
        targets = [small.target() for _ in range(4)]
        for i, target in enumerate(targets[:3]):
            node.NodePublishVolume(publish_request(target, "a", f"t{i}", readonly=True))
        with pytest.raises(grpc.RpcError) as refused:
            node.NodePublishVolume(publish_request(targets[3], "a", "t3", readonly=True))
        assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-tier-dirs" in refused.value.details(), refused.value.details()
        node.NodePublishVolume(publish_request(small.target(), "a", "t0", readonly=True))  # an existing one: fine
        _unpublish(node, targets[1])  # t1's only pod goes: room for one more
        node.NodePublishVolume(publish_request(targets[3], "a", "t3", readonly=True))


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


@pytest.mark.parametrize("pod", ["tenant-0", "kv", "kv-x2b4c-0", "other-x2b4c", "kv-xaeio"])
def test_only_the_tiers_server_pod_gets_its_directory_writable(plugin, pod):
    node = _node(plugin)
    target = plugin.target()
    with pytest.raises(grpc.RpcError) as refused:
        node.NodePublishVolume(publish_request(target, "a", "kv", pod=pod))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details().startswith("readOnly:"), refused.value.details()
    assert "kv-" in refused.value.details(), "the message names the server pods' names"
    assert mounts_under(plugin.root) == [] and not plugin.state_dir.exists()


def test_a_tenant_pod_cannot_take_the_tiers_socket(plugin, tmp_path):
    node = _node(plugin)
    server, attacker, client = plugin.target(), plugin.target(), plugin.target()
    node.NodePublishVolume(publish_request(server, "a", "kv", pod=server_pod("kv")))
    with pytest.raises(grpc.RpcError) as refused:
        node.NodePublishVolume(publish_request(attacker, "a", "kv", pod="attacker"))
    assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
    node.NodePublishVolume(publish_request(attacker, "a", "kv", pod="attacker", readonly=True))
    node.NodePublishVolume(publish_request(client, "a", "kv", readonly=True))
    token = "t0ken-for-the-tier"
    (tmp_path / "token").write_text(token)
    config = {"listen": {"unix_socket": str(server / "kv.sock")}, "auth": {"token_file": str(tmp_path / "token")}}
    with running_kv_server(tmp_path / "kv", config, l2_fs=False):
        tried = _as(1000, [SOCKET_GROUP], TAKE_THE_SOCKET, str(attacker)).strip()
        assert tried == "Read-only file system,Address already in use,Read-only file system", tried
        reached = _as(1000, [SOCKET_GROUP], CLIENT, str(client / "kv.sock"), token).strip()
        assert reached == "from-the-client", "the client reached the real server"


def test_a_restarted_plugin_tears_down_what_the_last_one_mounted(plugin):
    """The plugin keeps no state but the mount table, so a restart between publish and unpublish still
    leaves nothing behind."""
    node = _node(plugin)
    server, client = plugin.target(), plugin.target()
    node.NodePublishVolume(publish_request(server, "a", "kv", pod=server_pod("kv")))
    node.NodePublishVolume(publish_request(client, "a", "kv", readonly=True))
    (server / "kv.sock").write_bytes(b"")
    assert plugin.stop() == 0
    plugin.start()
    node = _node(plugin)
    node.NodePublishVolume(publish_request(plugin.target(), "a", "kv", readonly=True))
    assert (plugin.state_dir / "a" / "kv" / "kv.sock").exists(), "the same directory, not a new one"
    for target in (server, client, *plugin.kubelet_dir.glob("pods/*/volumes/*/*/mount")):
        _unpublish(node, target)
    assert not (plugin.state_dir / "a").exists() and mounts_under(plugin.root) == []
