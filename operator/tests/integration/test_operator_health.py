"""The operator's /healthz probe against the real API server, and against one that is gone."""

from __future__ import annotations

import datetime
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from strata_operator import kube
from strata_operator.handlers import process
from strata_testsupport.cluster import install_crds
from strata_testsupport.kube import resource
from strata_testsupport.processes import free_port

pytestmark = pytest.mark.integration


def standalone() -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.peering.standalone = True
    return settings


@pytest.fixture
def unreachable_api(control_plane: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The control plane's kubeconfig with its server moved to a port nothing listens on."""
    config = yaml.safe_load(Path(control_plane.kubeconfig).read_text())
    for cluster in config["clusters"]:
        cluster["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    dead = tmp_path / "kubeconfig"
    dead.write_text(yaml.safe_dump(config))
    monkeypatch.setenv("KUBECONFIG", str(dead))
    kube.reset_clients()
    yield
    monkeypatch.undo()
    kube.reset_clients()


def test_health_is_ready_while_the_api_server_answers(control_plane: Any) -> None:
    assert process.readiness_probe(settings=standalone()) == "active"


def test_health_fails_while_the_api_server_is_unreachable(unreachable_api: None) -> None:
    with pytest.raises(kopf.PermanentError, match="the API server is unreachable"):
        process.readiness_probe(settings=standalone())


PEERING_CRDS = Path(__file__).resolve().parents[3] / "charts" / "strata" / "crds" / "kopf-peering.yaml"


def clusterwide(name: str, priority: int) -> kopf.OperatorSettings:
    settings = kopf.OperatorSettings()
    settings.peering.standalone = False
    settings.peering.clusterwide = True
    settings.peering.name = name
    settings.peering.priority = priority
    return settings


def test_health_fails_when_a_priority_tie_pauses_every_replica(k8s: Any, control_plane: Any) -> None:
    """Two replicas of one priority: kopf pauses both, and /healthz used to say ready all the same."""
    install_crds(k8s, [doc for doc in yaml.safe_load_all(PEERING_CRDS.read_text()) if doc])
    now = datetime.datetime.now(datetime.UTC).isoformat()
    peers = {
        "a": {"priority": 7, "lifetime": 60, "lastseen": now},
        "b": {"priority": 7, "lifetime": 60, "lastseen": now},
    }
    name = f"health-{uuid.uuid4().hex[:8]}"
    peerings = resource(k8s, "kopf.dev/v1", "ClusterKopfPeering")
    peerings.create(body={"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": name}})
    try:
        peerings.patch(name=name, body={"status": peers}, content_type="application/merge-patch+json")
        with pytest.raises(kopf.PermanentError, match="none reconciles"):
            process.readiness_probe(settings=clusterwide(name, 7))
        peers["b"]["priority"] = 3
        peerings.patch(name=name, body={"status": peers}, content_type="application/merge-patch+json")
        assert process.readiness_probe(settings=clusterwide(name, 7)) == "active"
        assert process.readiness_probe(settings=clusterwide(name, 3)) == "standby"
    finally:
        peerings.delete(name=name)
