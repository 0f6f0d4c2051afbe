"""What GitOps tools conclude about a Strata resource, from the tools' own rules rather than ours.

`kstatus`: the session fixture around hack/kstatus (kstatus-check, built by hack/build-kstatus.sh), which runs the
library Flux judges health with (sigs.k8s.io/cli-utils' kstatus) on the objects it is given. `argo_health` runs
the Argo CD health check charts/strata/README.md tells users to paste into `argocd-cm`, as Lua (lupa). Both take
whole objects, so a test can hand them a status the operator's own builders rendered, or one read back from the
API server.
"""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from strata_testsupport.processes import serve_for_session, unavailable

REPO = Path(__file__).resolve().parents[2]
BUILD_SCRIPT = REPO / "hack" / "build-kstatus.sh"
CHART_README = REPO / "charts" / "strata" / "README.md"
GROUP_VERSION = "strata.dev/v1alpha1"


def build_kstatus() -> Path:
    """The kstatus-check binary, built once into the cache (a minute or so the first time: Go modules)."""
    result = subprocess.run(["bash", str(BUILD_SCRIPT)], capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{BUILD_SCRIPT} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    return Path(result.stdout.strip().splitlines()[-1])


@dataclass(frozen=True)
class Verdict:
    status: str
    """kstatus' status: InProgress, Current, Failed, Terminating, NotFound or Unknown."""
    message: str


@dataclass(frozen=True)
class KStatus:
    binary: Path

    def verdicts(self, objects: Sequence[Mapping[str, Any]]) -> list[Verdict]:
        """kstatus' verdict on each object, in order: one process for all of them."""
        result = subprocess.run(
            [str(self.binary)], input=json.dumps(list(objects)), capture_output=True, text=True, timeout=60
        )
        if result.returncode != 0:
            raise AssertionError(f"kstatus-check failed ({result.returncode}): {result.stderr}")
        lines = result.stdout.splitlines()
        assert len(lines) == len(objects), f"kstatus-check printed {len(lines)} lines for {len(objects)} objects"
        verdicts = []
        for line, obj in zip(lines, objects, strict=True):
            name, status, message = line.split(" ", 2)  # the message may be empty, never the separator
            assert name == obj["metadata"]["name"], f"kstatus-check answered {name!r} for {obj['metadata']['name']!r}"
            verdicts.append(Verdict(status, message))
        return verdicts

    def verdict(self, obj: Mapping[str, Any]) -> Verdict:
        return self.verdicts([obj])[0]


@pytest.fixture(scope="session")
def kstatus() -> Iterator[KStatus]:
    """kstatus-check, built on first use; without Go (or the module proxy) the tests skip, and fail under CI."""
    yield from serve_for_session("kstatus-check", lambda: contextlib.nullcontext(KStatus(build_kstatus())))


def custom_resource(
    kind: str, status: Mapping[str, Any] | None, *, generation: int, name: str = "x", deleting: bool = False
) -> dict[str, Any]:
    """A whole object of `kind` as the API server would return it, with `status` as given (None: none yet)."""
    metadata: dict[str, Any] = {"name": name, "namespace": "serving", "generation": generation}
    if deleting:
        metadata.update(deletionTimestamp="2026-01-01T00:00:00Z", finalizers=["strata.dev/cleanup"])
    obj: dict[str, Any] = {"apiVersion": GROUP_VERSION, "kind": kind, "metadata": metadata}
    if status is not None:
        obj["status"] = dict(status)
    return obj


VERDICTS: dict[str, tuple[str, str, str | None]] = {
    # situation: (kstatus, Argo CD, the condition whose message both tools show; None: they say it their own way)
    # Known gap: before the operator's first status, kstatus cannot tell an object no controller has seen from
    # one that has no status to give, and calls it Current; Argo CD waits for the operator.
    "ModelCache created, no status yet": ("Current", "Progressing", None),
    "ModelCache preloading": ("InProgress", "Progressing", "Reconciling"),
    "ModelCache Ready": ("Current", "Healthy", None),
    "ModelCache preloading a new revision (SharedPVC: the copy is replaced, not Ready meanwhile)": (
        "InProgress",
        "Progressing",
        "Reconciling",
    ),
    "ModelCache preload failed": ("Failed", "Degraded", "Stalled"),
    "ModelCache spec it cannot act on (a Secret missing)": ("Failed", "Degraded", "Stalled"),
    "ModelCache NodeLocal: one node's copy failed, another's Ready": ("Failed", "Degraded", "Stalled"),
    "ModelCache NodeLocal: a node lost, its copy Ready on another (usable, Degraded)": (
        "InProgress",
        "Progressing",
        "Reconciling",
    ),
    "ModelCache NodeLocal: every node lost": ("InProgress", "Progressing", "Reconciling"),
    "ModelCache NodeLocal: no node matches yet": ("InProgress", "Progressing", "Ready"),
    "ModelCache NodeLocal: every copy evicted": ("Failed", "Degraded", "Stalled"),
    "ModelCache ImageVolume: pods mount it while pre-pulls run (Ready and Reconciling)": (
        "InProgress",
        "Progressing",
        "Reconciling",
    ),
    "ModelCache ImageVolume: a pre-pull failed on a node, the volume works (usable, Degraded)": (
        "Failed",
        "Degraded",
        "Stalled",
    ),
    "ModelCache ImageVolume: the registry refuses the tag": ("Failed", "Degraded", "Stalled"),
    "ModelCache ImageVolume: the registry is unreachable, retrying": ("InProgress", "Progressing", "Reconciling"),
    "ModelCache ImageVolume: the registry is unreachable, waiting for the next attempt": (
        "InProgress",
        "Progressing",
        "Reconciling",
    ),
    "ModelCache ImageVolume: the tag is gone on re-resolution, the earlier digest serves (usable, Degraded)": (
        "Failed",
        "Degraded",
        "Stalled",
    ),
    "ModelCache spec change not observed yet": ("InProgress", "Progressing", None),
    "ModelCache being deleted": ("Terminating", "Progressing", None),
    "KVCacheTier created, no status yet": ("Current", "Progressing", None),
    "KVCacheTier starting": ("InProgress", "Progressing", "Reconciling"),
    "KVCacheTier rolling out a new configuration (old servers serve: Available)": (
        "InProgress",
        "Progressing",
        "Reconciling",
    ),
    "KVCacheTier all servers ready": ("Current", "Healthy", None),
    "KVCacheTier a server's node lost": ("InProgress", "Progressing", "Reconciling"),
    "KVCacheTier servers not ready past the startup grace": ("InProgress", "Progressing", "Reconciling"),
    "KVCacheTier configuration invalid": ("Failed", "Degraded", "Stalled"),
    "KVCacheTier no node matches": ("InProgress", "Progressing", "Ready"),
    "KVCacheTier spec change not observed yet": ("InProgress", "Progressing", None),
    "KVCacheTier being deleted": ("Terminating", "Progressing", None),
}
"""What Flux (kstatus) and Argo CD must conclude of a ModelCache or KVCacheTier in each situation, and which
condition's message both show. The unit tier renders every situation with the operator's builders
(operator/tests/unit/test_gitops_verdicts.py); the integration tier reads some back from the API server."""


# -- Argo CD --------------------------------------------------------------------------------------------------


def argo_health_scripts() -> dict[str, str]:
    """The `resource.customizations.health.*` entries of the chart README's argocd-cm block, by kind."""
    blocks = re.findall(r"```yaml\n(.*?)```", CHART_README.read_text(), re.S)
    (block,) = [b for b in blocks if "resource.customizations.health" in b]
    data = yaml.safe_load(block)["data"]
    return {key.rsplit("_", 1)[1]: script for key, script in data.items()}


def _to_lua(runtime: Any, value: Any) -> Any:
    if isinstance(value, Mapping):
        return runtime.table_from({k: _to_lua(runtime, v) for k, v in value.items()})
    if isinstance(value, list):
        return runtime.table_from([_to_lua(runtime, v) for v in value])
    return value


@dataclass(frozen=True)
class ArgoHealth:
    scripts: Mapping[str, str]

    def __call__(self, obj: Mapping[str, Any]) -> Verdict:
        """The script's (status, message) for `obj`, picked by its kind as Argo CD picks it."""
        import lupa

        runtime = lupa.LuaRuntime(unpack_returned_tuples=True)
        check = runtime.eval(f"function(obj)\n{self.scripts[obj['kind']]}\nend")
        result = check(_to_lua(runtime, obj))
        return Verdict(result["status"], result["message"])


@pytest.fixture(scope="session")
def argo_health() -> ArgoHealth:
    """The README's Argo CD health checks, run as Lua; without lupa (the dev extra) the tests skip, and fail
    under CI."""
    try:
        import lupa  # noqa: F401
    except ImportError:
        unavailable("lupa (Lua for Python, in the dev extra) is not installed: `make venv`")
    return ArgoHealth(argo_health_scripts())
