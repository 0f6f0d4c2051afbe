"""The runtime image (loader + kvserver) the operator puts into Jobs and DaemonSets by default.

Pure: what the operator was configured with arrives as a `RuntimeImage` (read once by `strata_operator.settings`).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata
from typing import Any

RUNTIME_IMAGE_REPOSITORY = "ghcr.io/strata-dev/strata-runtime"


def release_image() -> str:
    """The runtime image of the release matching this operator (used when none is configured)."""
    try:
        version = metadata.version("strata")
    except metadata.PackageNotFoundError:
        version = "latest"
    return f"{RUNTIME_IMAGE_REPOSITORY}:{version}"


def configured_runtime(image: str | None, pull_policy: str, pull_secrets: tuple[str, ...]) -> RuntimeImage:
    """The image the operator was configured with (`Settings`' runtime fields); this release's when none."""
    return RuntimeImage(image or release_image(), pull_policy, pull_secrets)


def default_runtime() -> RuntimeImage:
    """The release's image, pulled IfNotPresent, no pull Secrets: what builders use when not told otherwise."""
    return RuntimeImage(release_image())


@dataclass(frozen=True)
class RuntimeImage:
    """The default image of every pod the operator renders, how to pull it, and with which Secrets."""

    image: str
    pull_policy: str = "IfNotPresent"
    pull_secrets: tuple[str, ...] = ()

    def pull_policy_for(self, spec_image: str | None, spec_policy: str | None) -> str | None:
        """The spec's policy wins; the configured one applies to the configured image; else Kubernetes' default."""
        if spec_policy:
            return spec_policy
        return None if spec_image else self.pull_policy

    def pod_pull_secrets(self) -> list[dict[str, Any]]:
        """`imagePullSecrets` for a pod: Secret names, looked up in the pod's own namespace."""
        return [{"name": name} for name in self.pull_secrets]
