"""Session fixtures: a real local control plane, Strata's CRDs installed, the operator running in-process."""

from __future__ import annotations

import os
import uuid
import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient

from strata_testsupport.apirequests import Recorder, chart_denials, operator_runner, recording
from strata_testsupport.helm import helm_path
from strata_testsupport.kube import new_dynamic_client, resource, wait_for
from strata_testsupport.status import checked_status_writes


def missing(message: str) -> None:
    """Under CI a tier that can run here must run: a missing binary fails; locally it skips with a reason."""
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"{message} (CI=true: the integration tier must not be skipped)", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def control_plane() -> Iterator[Any]:
    from strata_operator import kube

    from strata_testsupport.localcluster import BinariesNotFound, LocalCluster

    try:
        cluster = LocalCluster()
    except BinariesNotFound as error:
        missing(str(error))
    previous = os.environ.get("KUBECONFIG")
    with cluster:
        os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
        kube.reset_clients()
        try:
            yield cluster
        finally:
            if previous is None:
                os.environ.pop("KUBECONFIG", None)
            else:
                os.environ["KUBECONFIG"] = previous
            kube.reset_clients()


@pytest.fixture(scope="session")
def k8s(control_plane: Any) -> DynamicClient:
    """A dynamic client as cluster admin."""
    return new_dynamic_client(str(control_plane.kubeconfig))


def install_crds(client: DynamicClient, crds: list[dict[str, Any]]) -> None:
    """Apply CRDs and wait until the API server serves them (Established)."""
    crd_api = resource(client, "apiextensions.k8s.io/v1", "CustomResourceDefinition")
    for crd in crds:
        crd_api.server_side_apply(
            body=crd, name=crd["metadata"]["name"], field_manager="strata-tests", force_conflicts=True
        )
    for crd in crds:

        def established(name: str = crd["metadata"]["name"]) -> bool:
            conditions = crd_api.get(name=name).to_dict().get("status", {}).get("conditions") or []
            return any(c["type"] == "Established" and c["status"] == "True" for c in conditions)

        wait_for(established, timeout=30, what=f"CRD {crd['metadata']['name']} established")
    client.resources.invalidate_cache()


@pytest.fixture(scope="session")
def strata_crds(k8s: DynamicClient) -> list[dict[str, Any]]:
    """Strata's CRDs, generated from the API models and installed for real."""
    from strata_operator.api.kinds import all_crds

    crds = all_crds()
    install_crds(k8s, crds)
    return crds


@pytest.fixture(scope="session")
def status_writes() -> Iterator[list[str]]:
    """Every status write of the in-process operator, checked against the kind's status model (see
    `strata_testsupport.status`); the list holds the writes that did not fit."""
    with checked_status_writes() as violations:
        yield violations


@pytest.fixture(scope="session")
def operator_api_requests(k8s: DynamicClient, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Recorder]:
    """Every API request the in-process operator and its webhook make in this session (`strata_testsupport.
    apirequests`). At the session's end each must be granted by the chart's RBAC, installed for all namespaces and
    for one: a request the chart does not grant fails the session, naming the request and the test that made it."""
    recorder = Recorder()
    with recording(recorder):
        yield recorder
    if not os.access(helm_path(), os.X_OK):
        message = f"no Helm CLI at {helm_path()} (bash hack/build-helm.sh): the operator's requests were not checked"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message, pytrace=False)
        warnings.warn(message, stacklevel=1)
        return
    denials = chart_denials(k8s, recorder.recorded, tmp=tmp_path_factory.mktemp("rbac-helm"))
    if denials:
        pytest.fail(
            "the chart's RBAC (charts/strata/templates/rbac.yaml, webhook.yaml) refuses requests the operator made,"
            " per install mode:\n" + "\n".join(denials),
            pytrace=False,
        )


@pytest.fixture(scope="session")
def operator(
    strata_crds: list[dict[str, Any]], control_plane: Any, status_writes: list[str], operator_api_requests: Recorder
) -> Iterator[Any]:
    """Strata's operator running in-process (kopf's KopfRunner) against the local control plane; its API requests
    are recorded (`operator_api_requests`)."""
    from strata_operator.cli import HANDLERS_MODULE

    args = ["run", "-m", HANDLERS_MODULE, "--standalone", "--all-namespaces", "--verbose"]
    with operator_runner(args, timeout=60) as runner:
        yield runner
    assert runner.exit_code == 0, runner.output
    assert runner.exception is None, runner.exception
    assert not status_writes, "\n".join(status_writes)


@pytest.fixture(autouse=True)
def status_fits_its_model(request: pytest.FixtureRequest) -> Iterator[None]:
    """A test that ran the operator fails if a status the operator wrote meanwhile does not fit its model."""
    if "operator" not in request.fixturenames:
        yield
        return
    violations: list[str] = request.getfixturevalue("status_writes")
    before = len(violations)
    yield
    assert violations[before:] == [], "status written outside its model:\n" + "\n".join(violations[before:])


@pytest.fixture
def namespace(k8s: DynamicClient) -> Iterator[str]:
    """A fresh namespace per test, deleted afterwards."""
    name = f"t-{uuid.uuid4().hex[:10]}"
    namespaces = resource(k8s, "v1", "Namespace")
    namespaces.create(body={"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    yield name
    namespaces.delete(name=name)
