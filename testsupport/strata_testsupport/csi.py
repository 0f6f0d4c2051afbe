"""A REAL `strata-kv-csi serve` process and gRPC clients for it, for tests without a kubelet.

`publish_request` builds what a kubelet sends for a pod's inline `csi` volume (the `csi.storage.k8s.io/*`
keys that `podInfoOnMount` adds, `ephemeral: "true"`, a mount capability): the one stand-in here, for the
kubelet itself, which the real-node tier runs for real.
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

from strata_testsupport.processes import stop_process


@dataclass
class CSIPluginProcess:
    root: Path  # holds kubelet/ (the kubelet's root directory) and state/ (the plugin's state directory)
    node_id: str = "test-node"
    args: list[str] = field(default_factory=list)  # more `serve` flags (limits)
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
):  # -> csi_pb2.NodePublishVolumeRequest
    """`pod` is the pod's name as the kubelet passes it; a tier's server pods are named `<tier>-<5 characters>`
    by its DaemonSet (`server_pod` makes one)."""
    from strata_kv.csi import csi_pb2

    context: dict[str, str] = {
        "csi.storage.k8s.io/pod.name": pod,
        "csi.storage.k8s.io/pod.uid": str(uuid.uuid4()),
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


def server_pod(tier: str, suffix: str = "x2b4c") -> str:
    """A name the tier's DaemonSet could give one of its pods (the generated suffix's alphabet)."""
    return f"{tier}-{suffix}"


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
def running_csi_plugin(*args: str) -> Iterator[CSIPluginProcess]:
    """A plugin (given more `serve` flags `args`) in a fresh short directory under /tmp (Unix socket paths are
    limited to 107 bytes), which unprivileged test clients may walk through; unmounted and removed afterwards."""
    root = Path(tempfile.mkdtemp(prefix="csi-", dir="/tmp"))
    os.chmod(root, 0o755)
    plugin = CSIPluginProcess(root, args=list(args))
    try:
        yield plugin.start()
    finally:
        plugin.stop()
        unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)
