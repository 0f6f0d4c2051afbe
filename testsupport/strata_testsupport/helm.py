"""The Helm CLI built from its Go module (hack/build-helm.sh), run against charts/strata as a user would."""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "strata"
HELM_GO_MOD = REPO / "hack" / "helm" / "go.mod"


def helm_path() -> Path:
    """Where hack/build-helm.sh puts the binary (or $HELM)."""
    if os.environ.get("HELM"):
        return Path(os.environ["HELM"])
    version = re.search(r"^require helm\.sh/helm/v3 (\S+)$", HELM_GO_MOD.read_text(), re.M)
    assert version, f"{HELM_GO_MOD} does not require helm.sh/helm/v3"
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "strata" / "bin" / f"helm-{version.group(1)}" / "helm"


class Helm:
    """The Helm CLI, run against charts/strata; values are passed as a YAML file, as a user would."""

    def __init__(self, binary: Path, tmp: Path) -> None:
        self.binary = binary
        self.tmp = tmp
        self._count = 0

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        # HELM_* homes in a temp dir: no repositories, plugins or cache from the machine leak in.
        env = {
            **os.environ,
            "HELM_CACHE_HOME": str(self.tmp / "cache"),
            "HELM_CONFIG_HOME": str(self.tmp / "config"),
            "HELM_DATA_HOME": str(self.tmp / "data"),
        }
        result = subprocess.run([str(self.binary), *args], capture_output=True, text=True, env=env, timeout=120)
        if check and result.returncode != 0:
            raise AssertionError(f"helm {' '.join(args)} failed ({result.returncode}):\n{result.stderr}")
        return result

    def values_file(self, values: Mapping[str, Any]) -> Path:
        self._count += 1
        path = self.tmp / f"values-{self._count}.yaml"
        path.write_text(yaml.safe_dump(dict(values)))
        return path

    def template_raw(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        release: str = "strata",
        namespace: str = "strata-system",
        extra: Iterable[str] = (),
    ) -> subprocess.CompletedProcess[str]:
        args = ["template", release, str(CHART), "--namespace", namespace, *extra]
        if values:
            args += ["--values", str(self.values_file(values))]
        return self.run(*args, check=False)

    def template(
        self,
        values: Mapping[str, Any] | None = None,
        *,
        release: str = "strata",
        namespace: str = "strata-system",
        include_crds: bool = False,
    ) -> list[dict[str, Any]]:
        """Rendered objects, in Helm's order."""
        extra = ["--include-crds"] if include_crds else []
        result = self.template_raw(values, release=release, namespace=namespace, extra=extra)
        if result.returncode != 0:
            raise AssertionError(f"helm template failed:\n{result.stderr}")
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]
