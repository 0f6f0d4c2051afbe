"""Fixtures for the chart tests: the Helm CLI built from its Go module (hack/build-helm.sh), and rendering."""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import pytest
from strata_testsupport.helm import CHART, REPO, Helm, helm_path


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def missing(message: str) -> None:
    """A tool the project installs is missing: under CI that fails (a skip would hide it); locally, skip."""
    if _in_ci():
        pytest.fail(f"{message} (CI=true: the chart tests must not be skipped)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def require_tool() -> Any:
    return missing


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    binary = helm_path()
    if not os.access(binary, os.X_OK):
        missing(f"no Helm CLI at {binary}: run `bash hack/build-helm.sh` (builds it from helm.sh/helm/v3)")
    return Helm(binary, tmp_path_factory.mktemp("helm"))


def find(objects: Iterable[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    matches = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(matches) == 1, f"expected one {kind} {name or ''}, found {len(matches)}"
    return matches[0]


def kinds(objects: Iterable[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


def pod_templates(objects: Iterable[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """(owner, pod template) for every workload in a rendered set of objects."""
    found = []
    for obj in objects:
        if obj["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Job", "ReplicaSet"):
            found.append((f"{obj['kind']}/{obj['metadata']['name']}", obj["spec"]["template"]))
        elif obj["kind"] == "CronJob":
            found.append((f"CronJob/{obj['metadata']['name']}", obj["spec"]["jobTemplate"]["spec"]["template"]))
    return found


# Exposed to test modules as fixtures: with --import-mode=importlib, test files cannot import this module.
@pytest.fixture(scope="session")
def chart_helpers() -> Any:
    class _Helpers:
        find = staticmethod(find)
        kinds = staticmethod(kinds)
        pod_templates = staticmethod(pod_templates)
        chart = CHART
        repo = REPO

    return _Helpers
