"""The runtime image (loader + kvserver) the operator puts into Jobs and DaemonSets by default."""

from __future__ import annotations

import os
from importlib import metadata

RUNTIME_IMAGE_ENV = "STRATA_RUNTIME_IMAGE"
RUNTIME_IMAGE_REPOSITORY = "ghcr.io/strata-dev/strata-runtime"


def default_runtime_image() -> str:
    """The image the chart configures (STRATA_RUNTIME_IMAGE), else the release matching this operator."""
    if configured := os.environ.get(RUNTIME_IMAGE_ENV):
        return configured
    try:
        version = metadata.version("strata")
    except metadata.PackageNotFoundError:
        version = "latest"
    return f"{RUNTIME_IMAGE_REPOSITORY}:{version}"
