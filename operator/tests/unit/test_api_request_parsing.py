"""The API-request recorder's reading of a URL into the attributes the API server's authorizer sees: what the
chart's RBAC is checked against at the end of the integration tier (strata_testsupport.apirequests)."""

from __future__ import annotations

import asyncio
import contextvars
import threading

import pytest
from strata_testsupport.apirequests import (
    OPERATOR,
    ApiRequest,
    InstallMode,
    Recorder,
    as_operator,
    binding_probes,
    parse,
    review_attributes,
)

SERVER = "https://127.0.0.1:6443"


def one(method: str, url: str, **kwargs: object) -> ApiRequest:
    (request,) = parse(method, url, **kwargs)  # type: ignore[arg-type]
    return request


@pytest.mark.parametrize(
    ("method", "url", "expected"),
    [
        # core group, namespaced: collection, object, subresource
        ("GET", "/api/v1/namespaces/ns/pods", ApiRequest("list", "", "v1", "pods", namespace="ns")),
        ("GET", "/api/v1/namespaces/ns/pods/p", ApiRequest("get", "", "v1", "pods", namespace="ns", name="p")),
        ("POST", "/api/v1/namespaces/ns/events", ApiRequest("create", "", "v1", "events", namespace="ns")),
        ("PUT", "/api/v1/namespaces/ns/configmaps/c", ApiRequest("update", "", "v1", "configmaps", "", "ns", "c")),
        ("DELETE", "/api/v1/namespaces/ns/pods/p", ApiRequest("delete", "", "v1", "pods", namespace="ns", name="p")),
        ("DELETE", "/api/v1/namespaces/ns/pods", ApiRequest("deletecollection", "", "v1", "pods", namespace="ns")),
        (
            "POST",
            "/api/v1/namespaces/ns/serviceaccounts/sa/token",
            ApiRequest("create", "", "v1", "serviceaccounts", "token", "ns", "sa"),
        ),
        # named groups
        (
            "PATCH",
            "/apis/strata.dev/v1alpha1/namespaces/ns/modelcaches/m/status",
            ApiRequest("patch", "strata.dev", "v1alpha1", "modelcaches", "status", "ns", "m"),
        ),
        ("GET", "/apis/batch/v1/namespaces/ns/jobs", ApiRequest("list", "batch", "v1", "jobs", namespace="ns")),
        # cluster-scoped kinds, and a namespaced kind across all namespaces: no namespace
        ("GET", "/api/v1/nodes/n1", ApiRequest("get", "", "v1", "nodes", name="n1")),
        ("PATCH", "/api/v1/nodes/n1", ApiRequest("patch", "", "v1", "nodes", name="n1")),
        ("GET", "/api/v1/pods?labelSelector=strata.dev%2Fmodel", ApiRequest("list", "", "v1", "pods")),
        (
            "GET",
            "/apis/storage.k8s.io/v1/storageclasses/fast",
            ApiRequest("get", "storage.k8s.io", "v1", "storageclasses", name="fast"),
        ),
        # the Namespace kind itself, and its subresources, are not "in" a namespace
        ("GET", "/api/v1/namespaces", ApiRequest("list", "", "v1", "namespaces")),
        ("GET", "/api/v1/namespaces/ns", ApiRequest("get", "", "v1", "namespaces", name="ns")),
        ("PUT", "/api/v1/namespaces/ns/finalize", ApiRequest("update", "", "v1", "namespaces", "finalize", None, "ns")),
        ("PATCH", "/api/v1/namespaces/ns/status", ApiRequest("patch", "", "v1", "namespaces", "status", None, "ns")),
        # watches: the query parameter (kopf, the dynamic client) and the old /watch/ prefix
        (
            "GET",
            "/apis/strata.dev/v1alpha1/modelcaches?watch=true&resourceVersion=12",
            ApiRequest("watch", "strata.dev", "v1alpha1", "modelcaches"),
        ),
        ("GET", "/api/v1/namespaces/ns/pods?watch=1", ApiRequest("watch", "", "v1", "pods", namespace="ns")),
        ("GET", "/api/v1/watch/namespaces/ns/pods", ApiRequest("watch", "", "v1", "pods", namespace="ns")),
        ("GET", "/api/v1/watch/nodes", ApiRequest("watch", "", "v1", "nodes")),
        ("GET", "/api/v1/nodes?watch=false", ApiRequest("list", "", "v1", "nodes")),
        # absolute URLs, as the kubernetes client passes them
        (
            "GET",
            f"{SERVER}/apis/apiextensions.k8s.io/v1/customresourcedefinitions",
            ApiRequest("list", "apiextensions.k8s.io", "v1", "customresourcedefinitions"),
        ),
        # outside the resource tree: discovery and /version, by path
        ("GET", f"{SERVER}/apis/strata.dev/v1alpha1", ApiRequest("get", path="/apis/strata.dev/v1alpha1")),
        ("GET", "/api", ApiRequest("get", path="/api")),
        ("GET", "/version", ApiRequest("get", path="/version")),
    ],
)
def test_a_url_becomes_the_authorizers_attributes(method: str, url: str, expected: ApiRequest) -> None:
    assert one(method, url) == expected


def test_query_parameters_passed_apart_from_the_url_count() -> None:
    """The kubernetes client hands a GET's parameters to urllib3 apart from the URL."""
    url = f"{SERVER}/api/v1/namespaces/ns/pods"
    assert one("GET", url, query=[("watch", True), ("timeoutSeconds", 5)]).verb == "watch"
    assert one("GET", url, query={"watch": "true"}).verb == "watch"
    assert one("GET", url, query=[("labelSelector", "a=b")]).verb == "list"


def test_server_side_apply_is_a_patch_and_a_create() -> None:
    """An apply creates the object when it is missing: the API server asks for both verbs."""
    url = "/apis/apps/v1/namespaces/ns/daemonsets/kv?fieldManager=strata-operator&force=true"
    assert [r.verb for r in parse("PATCH", url, content_type="application/apply-patch+yaml")] == ["patch", "create"]
    assert [r.verb for r in parse("PATCH", url, content_type="application/apply-patch+yaml; charset=utf-8")] == [
        "patch",
        "create",
    ]
    for merge in ("application/merge-patch+json", "application/json-patch+json", None):
        assert [r.verb for r in parse("PATCH", url, content_type=merge)] == ["patch"]


def test_the_recorder_keeps_one_of_each_permission() -> None:
    """Two objects of a kind in two namespaces are one permission; the same kind across all namespaces another."""
    recorder = Recorder()
    recorder.add(parse("GET", "/api/v1/namespaces/a/pods"))
    recorder.add(parse("GET", "/api/v1/namespaces/b/pods"))
    recorder.add(parse("GET", "/api/v1/pods"))
    assert len(recorder) == 2
    assert {r.request.namespace for r in recorder.recorded} == {"a", None}
    assert [r.namespace for r in recorder.made("list", "pods")] == ["a", None]


def test_review_attributes_per_install_mode() -> None:
    """Cluster-wide install: a namespaced kind is asked where it was used, across all namespaces when it was
    listed so; one watched namespace: always there. Cluster-scoped kinds: cluster-wide in both."""
    scopes = {("", "pods"): True, ("", "nodes"): False}
    everywhere, one_namespace = InstallMode("cluster-wide", None), InstallMode("namespaced", "watched")
    in_ns, across = one("GET", "/api/v1/namespaces/t-1/pods"), one("GET", "/api/v1/pods")
    assert review_attributes(in_ns, everywhere, scopes)["resourceAttributes"]["namespace"] == "t-1"
    assert "namespace" not in review_attributes(across, everywhere, scopes)["resourceAttributes"]
    for request in (in_ns, across):
        assert review_attributes(request, one_namespace, scopes)["resourceAttributes"]["namespace"] == "watched"
    node = one("PATCH", "/api/v1/nodes/n1")
    for mode in (everywhere, one_namespace):
        assert "namespace" not in review_attributes(node, mode, scopes)["resourceAttributes"]
    assert review_attributes(one("GET", "/version"), everywhere, scopes) == {
        "nonResourceAttributes": {"path": "/version", "verb": "get"}
    }


def test_the_operator_mark_follows_tasks_and_copied_contexts_but_not_bare_threads() -> None:
    """What the recorder relies on: asyncio copies the context into each task and to_thread into its thread; a
    thread started bare begins empty (why the controllers' reconciles run under copy_context().run)."""
    seen: dict[str, bool] = {}

    def in_thread(label: str) -> None:
        seen[label] = OPERATOR.get()

    async def operator_work() -> None:
        await asyncio.create_task(asyncio.sleep(0))
        seen["task"] = OPERATOR.get()
        await asyncio.to_thread(in_thread, "to_thread")
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, in_thread, "bare executor")
        await loop.run_in_executor(None, contextvars.copy_context().run, in_thread, "copied context")

    as_operator(asyncio.run, operator_work())
    bare = threading.Thread(target=in_thread, args=("bare thread",))
    bare.start()
    bare.join()
    assert seen == {
        "task": True,
        "to_thread": True,
        "bare executor": False,
        "copied context": True,
        "bare thread": False,
    }
    assert OPERATOR.get() is False, "as_operator leaves the caller's context unmarked"


def test_the_authorizer_is_awaited_on_one_rule_of_each_of_the_accounts_bindings() -> None:
    """chart_rbac asks these until all are allowed before it asks about any recorded request: a denial is then
    the chart's, not an authorizer that has not seen the new bindings yet. Bindings of other accounts are left out."""
    account = {"kind": "ServiceAccount", "name": "op", "namespace": "sys"}
    objects = [
        {"kind": "ServiceAccount", "metadata": {"name": "op", "namespace": "sys"}},
        {
            "kind": "ClusterRole",
            "metadata": {"name": "cluster"},
            "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list"]}],
        },
        {
            "kind": "ClusterRole",
            "metadata": {"name": "namespaced"},
            "rules": [{"apiGroups": ["strata.dev"], "resources": ["modelcaches/status"], "verbs": ["patch"]}],
        },
        {
            "kind": "Role",
            "metadata": {"name": "tls", "namespace": "sys"},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["tls"], "verbs": ["get"]}],
        },
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "cluster"},
            "roleRef": {"kind": "ClusterRole", "name": "cluster"},
            "subjects": [account],
        },
        {
            "kind": "RoleBinding",
            "metadata": {"name": "namespaced", "namespace": "watched"},
            "roleRef": {"kind": "ClusterRole", "name": "namespaced"},
            "subjects": [account],
        },
        {
            "kind": "RoleBinding",
            "metadata": {"name": "tls", "namespace": "sys"},
            "roleRef": {"kind": "Role", "name": "tls"},
            "subjects": [account],
        },
        {
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "csi"},
            "roleRef": {"kind": "ClusterRole", "name": "cluster"},
            "subjects": [{"kind": "ServiceAccount", "name": "csi-driver", "namespace": "sys"}],
        },
    ]
    assert [p["resourceAttributes"] for p in binding_probes(objects, "op", "sys")] == [
        {"verb": "get", "group": "", "resource": "nodes", "subresource": "", "name": ""},
        {
            "verb": "patch",
            "group": "strata.dev",
            "resource": "modelcaches",
            "subresource": "status",
            "name": "",
            "namespace": "watched",
        },
        {"verb": "get", "group": "", "resource": "secrets", "subresource": "", "name": "tls", "namespace": "sys"},
    ]
