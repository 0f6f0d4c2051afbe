"""containerd 2 for the real node: where the build cache keeps it (hack/build-containerd.sh, keyed by the version
hack/containerd/go.mod pins), the config it runs with, and the per-registry `hosts.toml` that says how to reach and
trust a registry.

containerd 2 rather than Debian's 1.6: it mounts image volumes (>= 2.1, subPath >= 2.2) and answers the kubelet's
CRI RuntimeConfig call (the cgroup driver comes from the runc options below, not from a guess). Everything it
writes stays under the node's work dir: its root and state, shim sockets, network namespaces, the hosts dir; NRI
(which would open a socket under /var/run) and config imports from /etc are off.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from strata_testsupport.localcluster.binaries import REPO_ROOT

MODULE = "github.com/containerd/containerd/v2"
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-containerd.sh"


@dataclass(frozen=True)
class ContainerdBinaries:
    containerd: Path
    shim: Path
    ctr: Path


def containerd_version() -> str:
    """The containerd version hack/containerd/go.mod pins."""
    for line in (REPO_ROOT / "hack" / "containerd" / "go.mod").read_text().splitlines():
        words = line.split()
        if words[:2] == ["require", MODULE] or words[:1] == [MODULE]:
            return words[-1]
    raise RuntimeError(f"hack/containerd/go.mod does not pin {MODULE}")


def find_containerd() -> ContainerdBinaries | None:
    """The cached build of the pinned version, or None when it was not built yet."""
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    directory = base / "strata" / "containerd" / containerd_version()
    found = ContainerdBinaries(directory / "containerd", directory / "containerd-shim-runc-v2", directory / "ctr")
    return found if all(os.access(p, os.X_OK) for p in (found.containerd, found.shim, found.ctr)) else None


@dataclass(frozen=True)
class ContainerdLayout:
    """Where one node's containerd keeps everything (all under the node's work dir)."""

    work_dir: Path

    @property
    def socket(self) -> Path:
        return self.work_dir / "run" / "containerd.sock"

    @property
    def hosts_dir(self) -> Path:
        """One `<host:port>/hosts.toml` per registry the node may pull from (CRI's registry config_path)."""
        return self.work_dir / "containerd" / "certs.d"


def render_config(
    layout: ContainerdLayout, shim: Path, *, pause_image: str, cni_bin_dir: Path, cni_conf_dir: Path
) -> str:
    """containerd's config (version 4, what containerd 2.4 writes by default)."""
    work = layout.work_dir
    return f"""version = 4
root = "{work / "containerd" / "root"}"
state = "{work / "run" / "containerd"}"
imports = []

[plugins."io.containerd.server.v1.grpc"]
  address = "{layout.socket}"
[plugins."io.containerd.server.v1.ttrpc"]
  address = "{layout.socket}.ttrpc"
[plugins."io.containerd.shim.v1.manager"]
  socket_dir = "{work / "run" / "s"}"
[plugins."io.containerd.internal.v1.opt"]
  path = "{work / "containerd" / "opt"}"
[plugins."io.containerd.nri.v1.nri"]
  disable = true

[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
  [plugins."io.containerd.cri.v1.images".pinned_images]
    sandbox = "{pause_image}"
  [plugins."io.containerd.cri.v1.images".registry]
    config_path = "{layout.hosts_dir}"

[plugins."io.containerd.cri.v1.runtime"]
  # Processes here lack CAP_SYS_RESOURCE: a negative oom_score_adj would make runc fail.
  restrict_oom_score_adj = true
  disable_apparmor = true
  netns_mounts_under_state_dir = true
  [plugins."io.containerd.cri.v1.runtime".containerd]
    default_runtime_name = "runc"
    [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      runtime_path = "{shim}"
      [plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
        # cgroupfs: these hosts are cgroup v1 and PID 1 is not systemd. The kubelet learns it from RuntimeConfig.
        SystemdCgroup = false
  [plugins."io.containerd.cri.v1.runtime".cni]
    bin_dirs = ["{cni_bin_dir}"]
    conf_dir = "{cni_conf_dir}"

[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
"""


def trust_registry(layout: ContainerdLayout, address: str, ca_file: Path | None) -> Path:
    """Let the node pull from the registry at `address` (host:port): over HTTPS trusting `ca_file`, or, without
    one, over plain HTTP — for that host and port only. Read at every pull: no restart needed."""
    scheme = "https" if ca_file else "http"
    lines = [f'server = "{scheme}://{address}"', "", f'[host."{scheme}://{address}"]']
    lines.append('  capabilities = ["pull", "resolve"]')
    if ca_file:
        lines.append(f'  ca = "{ca_file}"')
    path = layout.hosts_dir / address / "hosts.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")
    return path
