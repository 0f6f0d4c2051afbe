"""The reads of the capture sidecars' logs in a whole ModelCache reconcile (`handlers/modelcache/reconcile.py`
over `io.gather`), with the API faked at `strata_operator.kube`: how often a log is asked for, and what an error
answered to a read means."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException
from strata_operator import kube
from strata_operator.handlers.modelcache import io
from strata_operator.handlers.modelcache.node_cache import NodeCache
from strata_operator.handlers.modelcache.reconcile import reconcile
from strata_operator.resources.core import MODEL_CACHE_LABEL
from strata_operator.resources.modelcache.compile_cache import CaptureLogs
from strata_operator.resources.runtime_image import RuntimeImage
from urllib3.exceptions import ReadTimeoutError

from .test_compile_cache_status import MISSED, engine_pod

RUNTIME = RuntimeImage("registry.local/strata-runtime:test")


class FakeApi:
    """Just enough of the API for a SharedPVC cache with compileCache: objects applied are read back (with a
    uid), the consumer pods are listed, and every log read is recorded."""

    def __init__(self, consumer_pods: list[dict[str, Any]]) -> None:
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.consumer_pods = consumer_pods
        self.log_reads: list[str] = []
        self.status: dict[str, Any] = {}

    def read(self, _version: str, kind: str, name: str, _namespace: str | None = None) -> dict[str, Any] | None:
        return self.objects.get((kind, name))

    def list_objects(self, _version: str, kind: str, *, label_selector: str | None = None, **_: Any) -> list[Any]:
        return self.consumer_pods if kind == "Pod" and (label_selector or "").startswith(MODEL_CACHE_LABEL) else []

    def apply(self, body: dict[str, Any], **_: Any) -> dict[str, Any]:
        stored = {**body, "metadata": {**body["metadata"], "uid": f"uid-{body['metadata']['name']}"}}
        self.objects[(body["kind"], body["metadata"]["name"])] = stored
        return stored

    def pod_log(self, _namespace: str, name: str, _container: str, **_: Any) -> str:
        self.log_reads.append(name)
        return "compiling\n"  # no report yet: the capture is still awaited

    def patch_status(self, _version: str, _kind: str, _name: str, _namespace: str, status: Any, *_: Any) -> bool:
        self.status.update(status)
        return True


@pytest.fixture
def api(monkeypatch: pytest.MonkeyPatch) -> FakeApi:
    fake = FakeApi([engine_pod("engine", MISSED, capturing=True)])
    for name in ("read", "list_objects", "apply", "pod_log", "patch_status"):
        monkeypatch.setattr(kube, name, getattr(fake, name))
    return fake


CACHE = {
    "apiVersion": "strata.dev/v1alpha1",
    "kind": "ModelCache",
    "metadata": {"name": "llama", "namespace": "serving", "uid": "cache-uid", "generation": 1},
    "spec": {
        "source": {"uri": "s3://models/llama"},
        "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}},
        "compileCache": {"enabled": True},
    },
}


def test_a_reconcile_that_gathers_three_times_reads_each_awaited_capture_log_once(api: FakeApi) -> None:
    """A new SharedPVC cache gathers three times in one reconcile (the claim created, read back for its uid, then
    the Job's references): the sidecar's log is one request to a kubelet, asked for once."""
    asked: list[float] = []
    status, _ = reconcile(CACHE, {}, NodeCache(), RUNTIME, recheck=asked.append)
    assert {kind for kind, _ in api.objects} == {"PersistentVolumeClaim", "Job"}  # all three rounds ran
    assert api.log_reads == ["engine"]
    assert status["compileCache"]["capturing"] == 1 and asked == [10.0]


def refusing(status: int, api: FakeApi) -> Any:
    """A pod_log that answers every read with the API server's error `status` (recording it)."""

    def pod_log(_namespace: str, name: str, _container: str, **_: Any) -> str:
        api.log_reads.append(name)
        body = json.dumps({"kind": "Status", "code": status, "message": f"pods {name!r}: {status}"})
        raise ApiException(http_resp=FakeResponse(status, body))

    return pod_log


@dataclass
class FakeResponse:
    status: int
    data: str
    reason: str = ""

    def getheaders(self) -> dict[str, str]:
        return {}


def test_a_refused_log_read_ends_the_round_and_other_errors_do_not(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RBAC grants pods/log per namespace: after a 403 the other pods' reads would be refused alike. A pod gone
    (404) or a sidecar not started (400) says nothing about the next pod's log."""
    monkeypatch.setattr(kube, "pod_log", refusing(403, api))
    refused = io.read_capture_logs("serving", ["a", "bb"])
    assert api.log_reads == ["a"] and refused.asked and refused.forbidden == "pods 'a': 403"
    for status in (404, 400):
        api.log_reads.clear()
        monkeypatch.setattr(kube, "pod_log", refusing(status, api))
        failed = io.read_capture_logs("serving", ["a", "bb"])
        assert api.log_reads == ["a", "bb"] and failed == CaptureLogs(asked=True)


def test_a_log_read_the_kubelet_does_not_answer_in_time_is_tried_again_at_the_next_poll(
    api: FakeApi, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read past its timeout (urllib3's ReadTimeoutError, what the client raises for `_request_timeout`) is one
    slow kubelet: the other pods' logs are still read, and the reconcile does not fail on it."""

    def pod_log(_namespace: str, name: str, _container: str, **_: Any) -> str:
        api.log_reads.append(name)
        if name == "a":
            raise ReadTimeoutError(None, f"/api/v1/namespaces/serving/pods/{name}/log", "read timed out")
        return '{"event": "captured", "key": "k1"}'

    monkeypatch.setattr(kube, "pod_log", pod_log)
    read = io.read_capture_logs("serving", ["a", "bb"])
    assert api.log_reads == ["a", "bb"] and read.asked and read.forbidden is None
    assert set(read.reports) == {"bb"}
