"""Deleting a NodeLocal ModelCache: the finalizer's clean-up never hangs, and leaves nothing unrecorded.

The API is faked at the module boundary (Jobs, node patches, Events), so each case runs without a cluster.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import kopf
import pytest
from kubernetes.client.rest import ApiException
from kubernetes.dynamic.exceptions import ForbiddenError
from strata_operator import kube
from strata_operator.handlers.modelcache import cleanup as cleanup
from strata_operator.handlers.modelcache import events as handler
from strata_operator.resources.modelcache import names
from strata_operator.resources.modelcache.nodes import NodeInfo

NAMESPACE, NAME = "serving", "llama"
KEY = names.node_label_key(NAMESPACE, NAME)
LEFTOVER = names.leftover_annotation_key(NAMESPACE, NAME)
PATH = f"/var/lib/strata/models/{NAMESPACE}/{NAME}"
BODY = {
    "apiVersion": "strata.dev/v1alpha1",
    "kind": "ModelCache",
    "metadata": {"name": NAME, "namespace": NAMESPACE, "uid": "uid-1"},
}
SPEC = {"source": {"uri": "hf://org/model"}, "storage": {"mode": "NodeLocal"}}


def job_status(phase: str) -> dict[str, Any]:
    kind = {"Succeeded": "Complete", "Failed": "Failed"}.get(phase)
    return {"conditions": [{"type": kind, "status": "True"}]} if kind else {}


@dataclass
class FakeCluster:
    """Nodes holding a copy, the Jobs in the namespace, and what the code under test wrote."""

    ready: dict[str, bool]
    jobs: dict[str, dict[str, Any]] = field(default_factory=dict)
    terminating: bool = False
    deleted: list[str] = field(default_factory=list)
    annotations: dict[tuple[str, str], str | None] = field(default_factory=dict)
    node_events: list[tuple[str, str, str]] = field(default_factory=list)
    warnings: list[tuple[str, str]] = field(default_factory=list)

    def snapshot(self) -> dict[str, NodeInfo]:
        return {n: NodeInfo(n, f"uid-{n}", ready, {KEY: "Ready"}) for n, ready in self.ready.items()}

    def apply(self, body: dict[str, Any], **_: Any) -> Any:
        if self.terminating:
            message = f"unable to create new content in namespace {NAMESPACE} because it is being terminated"
            error = ApiException(status=403, reason="Forbidden")
            error.body = json.dumps(
                {"message": message, "details": {"causes": [{"reason": "NamespaceTerminating"}]}, "code": 403}
            )
            raise ForbiddenError(error)
        self.jobs[body["metadata"]["name"]] = {**body, "status": job_status("Running")}
        return body

    def list_children(self, _owner: Any, _v: str, _k: str, role: str) -> list[dict[str, Any]]:
        return [j for j in self.jobs.values() if j["metadata"]["labels"]["strata.dev/role"] == role]

    def delete_job(self, _ns: str, name: str) -> bool:
        self.deleted.append(name)
        return self.jobs.pop(name, None) is not None


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch) -> FakeCluster:
    fake = FakeCluster(ready={"gpu-a": True, "gpu-b": True})
    monkeypatch.setattr(cleanup, "list_children", fake.list_children)
    monkeypatch.setattr(kube, "read", lambda _v, _k, name, _ns=None: fake.jobs.get(name))
    monkeypatch.setattr(cleanup, "delete_job", fake.delete_job)
    monkeypatch.setattr(cleanup, "patch_node_label", lambda *_a: None)
    monkeypatch.setattr(
        cleanup, "patch_node_annotation", lambda node, key, value: fake.annotations.__setitem__((node, key), value)
    )
    monkeypatch.setattr(kube, "apply", fake.apply)
    monkeypatch.setattr(
        kube,
        "post_node_event",
        lambda node, _uid, type_, reason, message: fake.node_events.append((node, reason, message)) or True,
    )
    monkeypatch.setattr(kopf, "warn", lambda _body, reason, message: fake.warnings.append((reason, message)))
    return fake


def delete(cluster: FakeCluster, retry: int = 0) -> None:
    memo = kopf.Memo(modelcaches=handler.ModelCacheMemory(nodes=cluster))  # type: ignore[arg-type]
    handler.modelcache_deleted(
        body=BODY, spec=SPEC, status={}, retry=retry, memo=memo, logger=logging.getLogger("test")
    )


def test_a_namespace_being_deleted_releases_the_finalizer_and_records_the_copies(cluster: FakeCluster) -> None:
    cluster.terminating = True
    delete(cluster)  # returns: no TemporaryError, so kopf removes the finalizer
    assert cluster.annotations == {("gpu-a", LEFTOVER): PATH, ("gpu-b", LEFTOVER): PATH}
    assert [(n, r) for n, r, _ in cluster.node_events] == [
        ("gpu-a", "ModelCopyLeftBehind"),
        ("gpu-b", "ModelCopyLeftBehind"),
    ]
    assert PATH in cluster.node_events[0][2] and "being deleted" in cluster.node_events[0][2]
    assert cluster.warnings == []  # the cache's own namespace refuses Events


def test_running_clean_up_holds_the_finalizer(cluster: FakeCluster) -> None:
    with pytest.raises(kopf.TemporaryError):
        delete(cluster)
    assert len(cluster.list_children(None, "", "", "cleanup")) == 2 and cluster.annotations == {}


def test_giving_up_deletes_the_clean_up_jobs_and_records_the_copies(cluster: FakeCluster) -> None:
    with pytest.raises(kopf.TemporaryError):
        delete(cluster)
    delete(cluster, retry=handler.CLEANUP_ATTEMPTS)
    assert cluster.list_children(None, "", "", "cleanup") == []  # none left Pending forever
    assert ("CleanupTimedOut", "gave up waiting for clean-up on gpu-a, gpu-b") in cluster.warnings
    assert cluster.annotations == {("gpu-a", LEFTOVER): PATH, ("gpu-b", LEFTOVER): PATH}


def test_a_finished_clean_up_job_is_removed_with_the_finalizer(cluster: FakeCluster) -> None:
    with pytest.raises(kopf.TemporaryError):  # the first pass creates the Jobs
        delete(cluster)
    for job in cluster.jobs.values():
        job["status"] = job_status("Succeeded")
    delete(cluster, retry=1)
    assert cluster.jobs == {} and cluster.node_events == []
    assert cluster.annotations == {("gpu-a", LEFTOVER): None, ("gpu-b", LEFTOVER): None}


def test_a_node_that_cannot_run_its_clean_up_is_recorded_and_its_job_removed(cluster: FakeCluster) -> None:
    cluster.ready["gpu-b"] = False
    with pytest.raises(kopf.TemporaryError):
        delete(cluster)
    for job in cluster.jobs.values():
        if job["metadata"]["annotations"].get("strata.dev/node") == "gpu-a":
            job["status"] = job_status("Succeeded")
    delete(cluster, retry=1)
    assert cluster.jobs == {}
    assert cluster.annotations[("gpu-b", LEFTOVER)] == PATH and [n for n, _, _ in cluster.node_events] == ["gpu-b"]
