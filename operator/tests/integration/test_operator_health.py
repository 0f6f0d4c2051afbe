"""The operator's /healthz probe against the real API server, and against one that is gone."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kopf
import pytest
import yaml
from strata_operator import kube
from strata_operator.handlers import process
from strata_testsupport.localcluster.cluster import free_port

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
