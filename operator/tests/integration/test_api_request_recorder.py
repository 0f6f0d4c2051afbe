"""The recorder of the operator's API requests (strata_testsupport.apirequests), whose record the chart's RBAC is
checked against at the session's end: it sees the operator's requests through both clients, from kopf's loop and
from the reconcile threads, and not the tests' own; and the check reports what the chart does not grant."""

from __future__ import annotations

from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from strata_operator import kube
from strata_testsupport.apirequests import ApiRequest, Recorded, Recorder, chart_denials
from strata_testsupport.kube import resource

from .test_modelcache_support import create_cache, unique, wait_for_status

pytestmark = pytest.mark.integration


def test_a_reconcile_records_the_operators_requests_and_not_the_tests(
    k8s: DynamicClient, operator: Any, operator_api_requests: Recorder, namespace: str
) -> None:
    """The status patch of a ModelCache's reconcile (the kubernetes client, in a reconcile thread) and kopf's
    watch of ModelCaches (kopf's client, in its loop) are recorded; the test's own requests, through the same
    client and the operator's own helpers, are not."""
    name = unique("rec")
    spec = {
        "source": {"uri": "s3://models/recorded", "revision": "main"},
        "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}},
    }
    with operator_api_requests.capture() as captured:
        create_cache(k8s, namespace, name, spec)
        wait_for_status(k8s, namespace, name, lambda s: s.get("observedGeneration") == 1, "the cache's status")
        # The test's own: a kind the operator never lists, through the test's client and through the operator's
        # own client helper (called from the test's thread, so not the operator's).
        resource(k8s, "v1", "Secret").get(namespace=namespace)
        kube.list_objects("v1", "Secret", namespace=namespace)

    status_patch = ApiRequest("patch", "strata.dev", "v1alpha1", "modelcaches", "status", namespace, name)
    assert status_patch in captured, [r.describe() for r in captured]
    assert not [r for r in captured if r.resource == "secrets" and r.verb == "list"], "a test's request was recorded"
    # kopf's watch began before this test: the session's record has it.
    assert operator_api_requests.made("watch", "modelcaches", group="strata.dev")
    # The preloader Job, created by server-side apply: recorded as the patch and create the API server checks.
    jobs = {(r.verb, r.namespace) for r in captured if (r.group, r.resource) == ("batch", "jobs")}
    assert {("patch", namespace), ("create", namespace)} <= jobs, jobs


def test_the_chart_check_reports_a_request_the_chart_does_not_grant(
    k8s: DynamicClient, operator: Any, operator_api_requests: Recorder
) -> None:
    """Fabricated requests: deleting a Node, which neither install mode grants, and patching a ModelCache's
    status, which both do, beside everything the operator recorded so far (all granted)."""
    fabricated = [
        Recorded(ApiRequest("delete", "", "v1", "nodes", name="n1"), "fabricated"),
        Recorded(ApiRequest("patch", "strata.dev", "v1alpha1", "modelcaches", "status", "t-x", "m"), "fabricated"),
    ]
    denials = chart_denials(k8s, [*operator_api_requests.recorded, *fabricated])
    assert denials == [
        "cluster-wide: delete core nodes 'n1' cluster-wide (first made during fabricated)",
        "namespaced: delete core nodes 'n1' cluster-wide (first made during fabricated)",
    ]
