"""NodePublishVolume of strata-kv-csi (kv.strata.dev), next to its floor: the bare bind mount it makes.

A real plugin process and a real gRPC client, the requests a kubelet sends for an inline volume of a real pod
(a local control plane: etcd and kube-apiserver, which the plugin asks who the pod is and whether the tier
exists, as the chart's service account); each round publishes a fresh target and unpublishes it. The peer is
the same bind mount and unmount through mount(2) in this process, with no gRPC and no checks: what the plugin
adds on top is the difference. Needs root, the control plane binaries and the Helm CLI (`make setup`).

    .venv/bin/python bench/csi_publish.py [--rounds 200] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "testsupport"))

import grpc
from strata_kv.csi import csi_pb2, csi_pb2_grpc
from strata_kv.csi.fspath import open_beneath, open_root
from strata_kv.csi.mounts import bind_mount, unmount
from strata_testsupport.cluster import install_crds
from strata_testsupport.csi import CSICluster, plugin_credentials
from strata_testsupport.kube import new_dynamic_client
from strata_testsupport.localcluster import LocalCluster


def _ms(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered) * 1e3, ordered[int(len(ordered) * 0.95) - 1] * 1e3


def plugin_rounds(rounds: int) -> tuple[list[float], list[float]]:
    from strata_operator.api.registry import all_crds

    publish, unpublish = [], []
    with (
        LocalCluster(controller_manager=False, scheduler=False, kwok=False) as cluster,
        tempfile.TemporaryDirectory() as tmp,
    ):
        client = new_dynamic_client(str(cluster.kubeconfig))
        install_crds(client, all_crds())
        site = CSICluster(client, "bench-node", plugin_credentials(client, cluster, Path(tmp)))
        namespace = site.namespace()
        site.tier(namespace)
        pod = site.pod(namespace, "client")
        with site.plugin() as plugin:
            node = csi_pb2_grpc.NodeStub(grpc.insecure_channel(f"unix://{plugin.endpoint}"))
            # A pod of the tier holds its directory (a tmpfs) throughout, as its server does on a node.
            node.NodePublishVolume(CSICluster.request(plugin.target(), pod, "kv", readonly=True))
            for _ in range(rounds):
                target = plugin.target()
                request = CSICluster.request(target, pod, "kv", readonly=True)
                started = time.perf_counter()
                node.NodePublishVolume(request)
                publish.append(time.perf_counter() - started)
                started = time.perf_counter()
                node.NodeUnpublishVolume(csi_pb2.NodeUnpublishVolumeRequest(volume_id="v", target_path=str(target)))
                unpublish.append(time.perf_counter() - started)
    return publish, unpublish


def bare_rounds(rounds: int) -> tuple[list[float], list[float]]:
    mount, umount = [], []
    with tempfile.TemporaryDirectory(dir="/tmp") as root:
        source = Path(root) / "source"
        source.mkdir()
        source_fd, parent = open_root(str(source)), open_root(root)
        for i in range(rounds):
            target = Path(root) / f"t{i}"
            started = time.perf_counter()
            target.mkdir()
            bind_mount(source_fd, parent, target.name, read_only=True)
            mount.append(time.perf_counter() - started)
            started = time.perf_counter()
            mounted = open_beneath(parent, target.name)
            unmount(mounted)
            os.close(mounted)
            target.rmdir()
            umount.append(time.perf_counter() - started)
        os.close(source_fd)
        os.close(parent)
    return mount, umount


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--markdown", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("csi_publish: bind mounts need root")
    bare = bare_rounds(args.rounds)
    plugin = plugin_rounds(args.rounds)
    rows = []
    for what, ours, floor in (("publish (ro)", plugin[0], bare[0]), ("unpublish", plugin[1], bare[1])):
        (p50, p95), (b50, b95) = _ms(ours), _ms(floor)
        rows.append((what, p50, p95, b50, b95, p50 / b50))
    if args.markdown:
        print("| call | plugin p50 ms | plugin p95 ms | bare mount(2) p50 ms | bare p95 ms | ratio p50 |")
        print("|---|---|---|---|---|---|")
        for row in rows:
            print("| {} | {:.2f} | {:.2f} | {:.3f} | {:.3f} | {:.0f}x |".format(*row))
    else:
        for row in rows:
            print("{:<13} plugin p50 {:.2f} ms p95 {:.2f} ms | bare p50 {:.3f} ms p95 {:.3f} ms | {:.0f}x".format(*row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
