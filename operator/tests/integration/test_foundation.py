"""The foundation against a real API server: generated CRDs validate for real, the operator framework
creates owned children, and kube-controller-manager's garbage collector removes them.

A test-only kind (`StrataProbe`) with its own kopf registry exercises the shared machinery
(crdgen, settings, server-side apply, owner references) without depending on a product controller.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import kopf
import pytest
from kopf._core.intents import registries as kopf_registries
from kopf.testing import KopfRunner
from kubernetes.client.exceptions import ApiException
from kubernetes.dynamic import DynamicClient
from pydantic import Field
from strata_operator import kube
from strata_operator.api import API_VERSION
from strata_operator.api.base import CRDModel, cel
from strata_operator.api.crdgen import CRDSpec, build_crd
from strata_operator.handlers.process import configure, login
from strata_operator.resources.core import Owner, child_labels
from strata_testsupport.cluster import install_crds
from strata_testsupport.kube import get_or_none, resource, wait_for
from strata_testsupport.processes import free_port

pytestmark = pytest.mark.integration


class ProbeSpec(CRDModel):
    message: str = Field(min_length=1, max_length=40)
    replicas: int = Field(default=1, ge=0, le=5)
    origin: str = Field(
        default="local",
        json_schema_extra={"x-kubernetes-validations": [cel("self == oldSelf", "origin is immutable")]},
    )


class ProbeStatus(CRDModel):
    child: str | None = None


PROBE = CRDSpec(
    kind="StrataProbe",
    plural="strataprobes",
    spec_model=ProbeSpec,
    status_model=ProbeStatus,
    root_validations=(
        cel(
            "self.spec.replicas <= 3 || self.spec.message.startsWith('big')",
            "more than 3 replicas need a message starting with 'big'",
        ),
    ),
)

registry = kopf.OperatorRegistry()


@dataclass(frozen=True)
class ProbeRef(Owner):
    KIND = "StrataProbe"


kopf.on.login(registry=registry)(login)


@kopf.on.startup(registry=registry)
def _configure(settings: kopf.OperatorSettings, **_: Any) -> None:
    configure(settings)


@kopf.on.create("strata.dev", "v1alpha1", "strataprobes", registry=registry)
def _create_child(body: kopf.Body, name: str, namespace: str, spec: kopf.Spec, patch: kopf.Patch, **_: Any) -> None:
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": f"{name}-child",
            "namespace": namespace,
            "labels": child_labels(name),
            "ownerReferences": [ProbeRef.from_body(body).reference()],
        },
        "data": {"message": spec["message"]},
    }
    kube.apply(configmap)
    patch.status["child"] = configmap["metadata"]["name"]


@pytest.fixture(scope="module")
def probe_operator(k8s: DynamicClient) -> Iterator[KopfRunner]:
    # `kopf run` with an explicit registry makes it the process-wide default; Strata's own handlers must
    # keep theirs, so register them first and put the default back afterwards.
    import strata_operator.routes  # noqa: F401

    strata_registry = kopf_registries.get_default_registry()
    install_crds(k8s, [build_crd(PROBE)])
    try:
        with KopfRunner(["run", "--standalone", "--all-namespaces"], registry=registry, timeout=60) as runner:
            yield runner
    finally:
        kopf_registries.set_default_registry(strata_registry)
    assert runner.exception is None, runner.output


def _probe(name: str, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "StrataProbe", "metadata": {"name": name}, "spec": spec}


def test_child_has_owner_reference_and_is_garbage_collected(
    k8s: DynamicClient, probe_operator: KopfRunner, namespace: str
) -> None:
    probes = resource(k8s, API_VERSION, "StrataProbe")
    created = probes.create(body=_probe("alpha", message="hello"), namespace=namespace)

    child = wait_for(lambda: get_or_none(k8s, "v1", "ConfigMap", "alpha-child", namespace), what="child ConfigMap")
    owners = child.metadata.ownerReferences
    assert [(o.kind, o.name, o.uid, o.controller) for o in owners] == [
        ("StrataProbe", "alpha", created.metadata.uid, True)
    ]
    assert child.metadata.labels["app.kubernetes.io/managed-by"] == "strata"
    assert child.data["message"] == "hello"
    stored = wait_for(lambda: probes.get(name="alpha", namespace=namespace).to_dict().get("status"), what="status")
    assert stored["child"] == "alpha-child"

    probes.delete(name="alpha", namespace=namespace)
    wait_for(
        lambda: get_or_none(k8s, "v1", "ConfigMap", "alpha-child", namespace) is None,
        timeout=60,
        what="garbage collection of the child by kube-controller-manager",
    )


def test_schema_violation_is_rejected_by_the_api_server(k8s: DynamicClient, namespace: str) -> None:
    install_crds(k8s, [build_crd(PROBE)])
    probes = resource(k8s, API_VERSION, "StrataProbe")
    with pytest.raises(ApiException) as raised:
        probes.create(body=_probe("bad", message="", replicas=9), namespace=namespace)
    assert raised.value.status == 422
    assert "spec.message" in raised.value.body and "spec.replicas" in raised.value.body


def test_cel_rules_reach_the_user(k8s: DynamicClient, namespace: str) -> None:
    install_crds(k8s, [build_crd(PROBE)])
    probes = resource(k8s, API_VERSION, "StrataProbe")
    with pytest.raises(ApiException) as raised:
        probes.create(body=_probe("many", message="small", replicas=4), namespace=namespace)
    assert "more than 3 replicas need a message starting with 'big'" in raised.value.body

    probes.create(body=_probe("fixed", message="hi", origin="s3"), namespace=namespace)
    with pytest.raises(ApiException) as raised:
        probes.patch(
            name="fixed",
            namespace=namespace,
            body={"spec": {"origin": "gcs"}},
            content_type="application/merge-patch+json",
        )
    assert "origin is immutable" in raised.value.body


def test_defaults_come_from_the_schema(k8s: DynamicClient, namespace: str) -> None:
    install_crds(k8s, [build_crd(PROBE)])
    probes = resource(k8s, API_VERSION, "StrataProbe")
    stored = probes.create(body=_probe("defaults", message="hi"), namespace=namespace)
    assert stored.spec.replicas == 1 and stored.spec.origin == "local"
    assert get_or_none(k8s, API_VERSION, "StrataProbe", "defaults", namespace) is not None


def test_operator_command_serves_its_health_probe_and_stops_cleanly(control_plane: Any, strata_crds: Any) -> None:
    """`strata-operator run` as a real process: it logs in from $KUBECONFIG and answers /healthz."""
    port = free_port()
    env = {**os.environ, "KUBECONFIG": str(control_plane.kubeconfig)}
    process = subprocess.Popen(
        [sys.executable, "-m", "strata_operator.cli", "run", f"--liveness=http://127.0.0.1:{port}/healthz"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:

        def healthy() -> bool:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return process.poll() is not None and pytest.fail(f"operator exited: {process.returncode}")

        wait_for(healthy, timeout=60, what="the operator's /healthz")
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0, output.decode(errors="replace")[-3000:]
