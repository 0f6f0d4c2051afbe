"""Where the control plane binaries are: KUBEBUILDER_ASSETS (envtest's convention) or Strata's build cache."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]
BUILD_SCRIPT = REPO_ROOT / "hack" / "build-controlplane.sh"


class BinariesNotFound(RuntimeError):
    """The control plane binaries are missing; the message says how to build them."""


@dataclass(frozen=True)
class ControlPlaneBinaries:
    etcd: Path
    kube_apiserver: Path
    kube_controller_manager: Path | None
    kube_scheduler: Path | None
    kwok: Path | None
    kwok_stages: Path | None


def kubernetes_version() -> str:
    """The k8s.io/kubernetes version pinned in hack/controlplane/go.mod."""
    for line in (REPO_ROOT / "hack" / "controlplane" / "go.mod").read_text().splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "require" and parts[1] == "k8s.io/kubernetes":
            return parts[2]
    raise BinariesNotFound("hack/controlplane/go.mod does not pin k8s.io/kubernetes")


def cache_dir() -> Path:
    if explicit := os.environ.get("STRATA_BIN_DIR"):
        return Path(explicit)
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "strata" / "bin" / kubernetes_version()


def find_binaries() -> ControlPlaneBinaries:
    """Locate the binaries; envtest assets win when KUBEBUILDER_ASSETS is set."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    directory = Path(assets) if assets else cache_dir()

    def optional(name: str) -> Path | None:
        path = directory / name
        return path if os.access(path, os.X_OK) else None

    etcd, apiserver = optional("etcd"), optional("kube-apiserver")
    if etcd is None or apiserver is None:
        origin = "KUBEBUILDER_ASSETS" if assets else "the Strata build cache"
        raise BinariesNotFound(
            f"etcd and kube-apiserver not found in {directory} ({origin}); "
            f"build them with `make setup` (runs {BUILD_SCRIPT.relative_to(REPO_ROOT)})"
        )
    return ControlPlaneBinaries(
        etcd=etcd,
        kube_apiserver=apiserver,
        kube_controller_manager=optional("kube-controller-manager"),
        kube_scheduler=optional("kube-scheduler"),
        kwok=optional("kwok"),
        kwok_stages=directory / "kwok-stages.yaml" if (directory / "kwok-stages.yaml").is_file() else None,
    )
