"""A REAL `strata-kv-csi serve` process and gRPC clients for it, for tests without a kubelet.

`publish_request` builds what a kubelet sends for a pod's inline `csi` volume (the `csi.storage.k8s.io/*`
keys that `podInfoOnMount` adds, `ephemeral: "true"`, a mount capability): the one stand-in here, for the
kubelet itself, which the real-node tier runs for real. The pods it names are real: `CSICluster` (fixture
`csi_cluster`) makes them in the local control plane, a tier's server pods through the operator's DaemonSet and
the DaemonSet controller, and runs the plugin as a service account holding only the chart's ClusterRole.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from strata_testsupport.processes import stop_process


@dataclass
class CSIPluginProcess:
    root: Path  # holds kubelet/ (the kubelet's root directory) and state/ (the plugin's state directory)
    node_id: str = "test-node"
    args: list[str] = field(default_factory=list)  # more `serve` flags (limits, the API server)
    process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def kubelet_dir(self) -> Path:
        return self.root / "kubelet"

    @property
    def state_dir(self) -> Path:
        return self.root / "state"

    @property
    def endpoint(self) -> Path:
        return self.kubelet_dir / "plugins" / "kv.strata.dev" / "csi.sock"

    @property
    def registration_socket(self) -> Path:
        return self.kubelet_dir / "plugins_registry" / "kv.strata.dev-reg.sock"

    @property
    def log_path(self) -> Path:
        return self.root / "plugin.log"

    def start(self, timeout: float = 30.0) -> CSIPluginProcess:
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "strata_kv.csi.cli", "serve", "--node-id", self.node_id]
        argv += ["--kubelet-dir", str(self.kubelet_dir), "--state-dir", str(self.state_dir), *self.args]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if "strata-kv-csi ready" in self.log():
                return self
            if self.process.poll() is not None:
                raise RuntimeError(f"strata-kv-csi exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"strata-kv-csi did not become ready in {timeout}s:\n{self.log()[-3000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> int | None:
        return stop_process(self.process) if self.process is not None else None

    def target(self, pod: str = "", volume: str = "kv") -> Path:
        """A target path where the kubelet puts one: <kubelet-dir>/pods/<uid>/volumes/kubernetes.io~csi/<vol>/mount."""
        pod = pod or uuid.uuid4().hex[:8]  # short: a socket's path inside it must fit in 107 bytes
        parent = self.kubelet_dir / "pods" / pod / "volumes" / "kubernetes.io~csi" / volume
        parent.mkdir(parents=True, exist_ok=True)
        return parent / "mount"


def publish_request(
    target: Path | str,
    namespace: str | None,
    tier: str | None,
    *,
    readonly: bool = False,
    attributes: dict[str, str] | None = None,
    ephemeral: bool = True,
    pod: str = "serving-0",
    uid: str = "",
):  # -> csi_pb2.NodePublishVolumeRequest
    """`pod` and `uid` are the pod's name and uid as the kubelet passes them (`CSICluster.request` fills them
    from a real pod)."""
    from strata_kv.csi import csi_pb2

    context: dict[str, str] = {
        "csi.storage.k8s.io/pod.name": pod,
        "csi.storage.k8s.io/pod.uid": uid or str(uuid.uuid4()),
        "csi.storage.k8s.io/serviceAccount.name": "default",
        "csi.storage.k8s.io/ephemeral": "true" if ephemeral else "false",
    }
    if namespace is not None:
        context["csi.storage.k8s.io/pod.namespace"] = namespace
    if tier is not None:
        context["tier"] = tier
    context.update(attributes or {})
    mode = csi_pb2.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
    return csi_pb2.NodePublishVolumeRequest(
        volume_id=f"csi-{uuid.uuid4().hex}",
        target_path=str(target),
        readonly=readonly,
        volume_capability=csi_pb2.VolumeCapability(
            mount=csi_pb2.VolumeCapability.MountVolume(), access_mode=csi_pb2.VolumeCapability.AccessMode(mode=mode)
        ),
        volume_context=context,
    )


def mounts_under(root: Path) -> list[str]:
    from strata_kv.csi.mounts import _unescape

    prefix = str(root).rstrip("/") + "/"
    with open("/proc/self/mountinfo") as lines:
        points = [_unescape(line.split(" ")[4]) for line in lines]
    return [p for p in points if p.startswith(prefix)]


def unmount_under(root: Path) -> None:
    """Whatever a failed test left mounted below `root`, deepest first."""
    for point in sorted(mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True)


@contextlib.contextmanager
def running_csi_plugin(*args: str, node_id: str = "test-node") -> Iterator[CSIPluginProcess]:
    """A plugin (given more `serve` flags `args`) in a fresh short directory under /tmp (Unix socket paths are
    limited to 107 bytes), which unprivileged test clients may walk through; unmounted and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
    os.chmod(root, 0o755)
    plugin = CSIPluginProcess(root, node_id=node_id, args=list(args))
    try:
        yield plugin.start()
    finally:
        plugin.stop()
        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


DRIVER = "kv.strata.dev"
API = "strata.dev/v1alpha1"


@dataclass
class CSICluster:
    """The local control plane as the plugin sees it: a node of its own (kwok's), the operator running, the
    CSIDriver, and the plugin's credentials (a service account token with only the chart's ClusterRole)."""

    client: Any  # an admin DynamicClient
    node: str
    api_args: list[str]

    def plugin(self, *args: str) -> contextlib.AbstractContextManager[CSIPluginProcess]:
        return running_csi_plugin(*self.api_args, *args, node_id=self.node)

    def namespace(self) -> str:
        from strata_testsupport.kube import resource

        name = f"csi-{uuid.uuid4().hex[:8]}"
        resource(self.client, "v1", "Namespace").create(
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
        )
        return name

    def tier(self, namespace: str, name: str = "kv", **spec: Any) -> dict[str, Any]:
        """A KVCacheTier serving a node socket on this node (the operator makes its DaemonSet)."""
        from strata_testsupport.kube import resource

        body = {
            "apiVersion": API,
            "kind": "KVCacheTier",
            "metadata": {"name": name},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": self.node},
                "tolerations": [{"operator": "Exists"}],  # kwok's node, Ready or not
                "l1": {"size": "64Mi"},
                "nodeSocket": {"enabled": True},
                **spec,
            },
        }
        return dict(resource(self.client, API, "KVCacheTier").create(namespace=namespace, body=body).to_dict())

    def server_pod(self, namespace: str, tier: str) -> dict[str, Any]:
        """The tier's KV server pod on this node, as the DaemonSet controller created it."""
        from strata_testsupport.kube import resource, wait_for

        pods = resource(self.client, "v1", "Pod")

        def created() -> dict[str, Any] | None:
            for pod in pods.get(namespace=namespace).to_dict()["items"]:
                refs: list[dict[str, Any]] = pod["metadata"].get("ownerReferences") or []
                owner = next((r for r in refs if r.get("controller")), {})
                if owner.get("kind") == "DaemonSet" and owner.get("name") == tier and pod["spec"].get("nodeName"):
                    return dict(pod)
            return None

        found = wait_for(created, timeout=90, what=f"the DaemonSet controller's pod of tier {namespace}/{tier}")
        assert found is not None
        return found

    def pod(self, namespace: str, name: str, **metadata: Any) -> dict[str, Any]:
        """A pod bound to this node, created as a tenant would (its name, labels, ownerReferences its own)."""
        from strata_testsupport.kube import resource

        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, **metadata},
            "spec": {
                "nodeName": self.node,
                "containers": [{"name": "c", "image": "busybox", "command": ["sleep", "infinity"]}],
            },
        }
        return dict(resource(self.client, "v1", "Pod").create(namespace=namespace, body=body).to_dict())

    @staticmethod
    def request(target: Path | str, pod: dict[str, Any], tier: str, **kwargs: Any) -> Any:
        """What the kubelet sends to publish `pod`'s volume of `tier` at `target`."""
        meta = pod["metadata"]
        return publish_request(target, meta["namespace"], tier, pod=meta["name"], uid=meta["uid"], **kwargs)


def plugin_credentials(client: Any, control_plane: Any, directory: Path) -> list[str]:
    """`serve` flags for the API server as a service account bound to the chart's ClusterRole for the plugin
    (rendered by the Helm CLI from charts/strata): the plugin gets exactly the rights it would in a cluster."""
    from kubernetes.client import CoreV1Api

    from strata_testsupport.cluster import missing
    from strata_testsupport.helm import Helm, helm_path
    from strata_testsupport.kube import resource

    binary = helm_path()
    if not os.access(binary, os.X_OK):
        missing(f"no Helm CLI at {binary}: run `bash hack/build-helm.sh`")
    rendered = Helm(binary, directory).template({"kvSocketDriver": {"enabled": True}})
    role = next(
        o for o in rendered if o["kind"] == "ClusterRole" and o["metadata"]["name"].endswith("kv-socket-driver")
    )
    namespace, account = "strata-csi-tests", "kv-socket-driver"
    with contextlib.suppress(Exception):
        resource(client, "v1", "Namespace").create(
            body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        )
    with contextlib.suppress(Exception):
        resource(client, "v1", "ServiceAccount").create(
            namespace=namespace,
            body={"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": account}},
        )
    role["metadata"] = {"name": "strata-csi-tests-kv-socket-driver"}
    binding: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": "strata-csi-tests-kv-socket-driver"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role["metadata"]["name"]},
        "subjects": [{"kind": "ServiceAccount", "name": account, "namespace": namespace}],
    }
    for obj in (role, binding):
        resource(client, obj["apiVersion"], obj["kind"]).server_side_apply(
            body=obj, name=obj["metadata"]["name"], field_manager="strata-tests", force_conflicts=True
        )
    token = CoreV1Api(client.client).create_namespaced_service_account_token(
        account, namespace, {"spec": {"expirationSeconds": 7200}}
    )
    token_file = directory / "plugin-token"
    token_file.write_text(token.status.token)
    return [
        f"--api-server={control_plane.server}",
        f"--api-token-file={token_file}",
        f"--api-ca-file={control_plane.pki['ca_crt']}",
    ]


def _csidriver() -> dict[str, Any]:
    return yaml.safe_load(
        """
apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {name: kv.strata.dev}
spec: {attachRequired: false, podInfoOnMount: true, volumeLifecycleModes: [Ephemeral], fsGroupPolicy: None}
"""
    )


@pytest.fixture(scope="session")
def csi_cluster(
    k8s: Any, control_plane: Any, operator: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CSICluster]:
    from strata_testsupport.kube import create_fake_node, delete_quietly, get_or_none, resource

    if os.geteuid() != 0:
        pytest.skip("bind mounts need root")  # the machine's CI runs as root: never skipped there
    args = plugin_credentials(k8s, control_plane, tmp_path_factory.mktemp("csi-api"))
    node = f"csi-node-{uuid.uuid4().hex[:6]}"
    create_fake_node(k8s, node)
    made_driver = get_or_none(k8s, "storage.k8s.io/v1", "CSIDriver", DRIVER, None) is None
    if made_driver:
        resource(k8s, "storage.k8s.io/v1", "CSIDriver").create(body=_csidriver())
    try:
        yield CSICluster(k8s, node, args)
    finally:
        delete_quietly(k8s, "v1", "Node", node, None)
        if made_driver:
            delete_quietly(k8s, "storage.k8s.io/v1", "CSIDriver", DRIVER, None)
