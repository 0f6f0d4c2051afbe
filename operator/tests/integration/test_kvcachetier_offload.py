"""The offload verdict end to end: the operator's reconcile (in-process, against the real API server) scrapes a
real `strata-kv serve`, and client traffic decides OffloadEffective: prefixes reused → Pays, never reused →
DoesNotPay, too little → InsufficientData. The server's pod is an API object whose status points at the process.

The reconcile is called with `scrape=True` and explicit times (the daemon scrapes once a minute; a test does not
wait for it), so each verdict covers exactly the traffic sent since the previous one. The in-process operator runs
meanwhile (as after any earlier test of the session) with its daemon's scrape turned off: its own samples, taken
at the wall clock, would otherwise land between the test's.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes.dynamic import DynamicClient
from strata_operator.api.kvcachetier import KVCacheTierStatus
from strata_operator.handlers.kvcachetier import events as tier_events
from strata_operator.handlers.kvcachetier import reconcile as reconciler
from strata_operator.resources.kvcachetier.names import TierRef
from strata_testsupport.kube import delete_quietly, printed_row, resource
from strata_testsupport.kvserver import KVServerProcess, running_kv_server

pytestmark = pytest.mark.integration

API, KIND = "strata.dev/v1alpha1", "KVCacheTier"
T0 = datetime.datetime(2026, 12, 4, 10, 0, tzinfo=datetime.UTC)
VALUE = b"k" * 16384


def at(minutes: int) -> str:
    return (T0 + datetime.timedelta(minutes=minutes)).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def kv(tmp_path: Path) -> Iterator[KVServerProcess]:
    with running_kv_server(tmp_path / "kv", {"l1": {"size": "64MiB"}}, l2_fs=False) as server:
        yield server


def server_pod(k8s: DynamicClient, namespace: str, tier: dict[str, Any], node: str) -> None:
    """A pod of the tier's DaemonSet as the API server would hold it, Ready, its IP the loopback the real server
    listens on."""
    ref = TierRef.from_body(tier)
    pods = resource(k8s, "v1", "Pod")
    body = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "kv-server-0", "labels": ref.selector_labels()},
        "spec": {"nodeName": node, "containers": [{"name": "kvserver", "image": "strata-runtime:test"}]},
    }
    pods.create(body=body, namespace=namespace)
    status = {
        "phase": "Running",
        "podIP": "127.0.0.1",
        "podIPs": [{"ip": "127.0.0.1"}],
        "conditions": [{"type": "Ready", "status": "True"}],
        "containerStatuses": [
            {
                "name": "kvserver",
                "image": "strata-runtime:test",
                "imageID": "",
                "ready": True,
                "restartCount": 0,
                "state": {"running": {}},
            }
        ],
    }
    pods.status.patch(
        name="kv-server-0",
        namespace=namespace,
        body={"status": status},
        content_type="application/strategic-merge-patch+json",
    )


def reconcile_at(k8s: DynamicClient, namespace: str, minutes: int) -> reconciler.Outcome:
    body = dict(resource(k8s, API, KIND).get(name="kv", namespace=namespace).to_dict())
    outcome = reconciler.reconcile(body, full=False, scrape=True, now=at(minutes))
    assert outcome is not None
    KVCacheTierStatus.model_validate(outcome.status)
    return outcome


def offload_effective(outcome: reconciler.Outcome) -> tuple[str, str]:
    found = next(c for c in outcome.status["conditions"] if c["type"] == "OffloadEffective")
    return found["status"], found["reason"]


def printed(k8s: DynamicClient, namespace: str) -> dict[str, Any]:
    """`kubectl get kvcachetier`'s row."""
    return printed_row(k8s, API, "kvcachetiers", namespace, "kv")


@pytest.fixture
def operator_not_scraping(operator: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The session's operator, reconciling this test's tier as usual but never scraping it (its first reconcile
    scrapes at once, the next ones a minute apart)."""
    monkeypatch.setattr(tier_events, "USAGE_INTERVAL_SECONDS", float("inf"))
    return operator


def test_reused_prefixes_pay_unique_ones_do_not_and_a_trickle_is_insufficient(
    k8s: DynamicClient, strata_crds: Any, namespace: str, kv: KVServerProcess, operator_not_scraping: Any
) -> None:
    node = f"{namespace}-node"
    resource(k8s, "v1", "Node").create(body={"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}})
    try:
        spec = {
            "l1": {"size": "64Mi"},
            "metricsPort": kv.metrics_port,
            "auth": {"disabled": True},
            "offloadVerdict": {"windowSeconds": 30, "minLookups": 200},
        }
        body = {"apiVersion": API, "kind": KIND, "metadata": {"name": "kv"}, "spec": spec}
        tier = dict(resource(k8s, API, KIND).create(body=body, namespace=namespace).to_dict())
        server_pod(k8s, namespace, tier, node)
        client = kv.redis()

        assert offload_effective(reconcile_at(k8s, namespace, 0)) == ("Unknown", "InsufficientData")

        # A few documents whose chunks every request reads again (MGET and GET): the tier answers 1,000 lookups.
        for chunk in range(50):
            client.set(f"doc@{chunk}", VALUE)
        for _ in range(10):
            assert all(v == VALUE for v in client.mget([f"doc@{chunk}" for chunk in range(50)]))
            for chunk in range(50):
                assert client.get(f"doc@{chunk}") == VALUE
        paying = reconcile_at(k8s, namespace, 1)
        assert offload_effective(paying) == ("True", "Pays"), paying.status["offload"]
        offload = paying.status["offload"]
        assert offload["hitRatio"] == "1.000" and offload["lookups"] == 1000
        assert offload["storedBytes"] == 50 * len(VALUE) and offload["loadedBytes"] == 1000 * len(VALUE)
        assert offload["unreadShare"] == "0.000" and float(offload["recomputeSavedSeconds"]) > 0
        # No consumer engine to ask: the setting's 115 us per token (256-token chunks: 29.44 ms per hit).
        assert (offload["recomputeSource"], offload["recomputeMicrosecondsPerToken"]) == ("Setting", 115)
        assert offload["recomputeSavedSeconds"] == f"{1000 * 256 * 115 / 1e6:.6f}"
        row = printed(k8s, namespace)
        assert (row["Hit"], row["Offload"]) == ("1.000", "Pays")

        # Every request a new prefix: each lookup misses, each chunk is stored and never read.
        for request in range(400):
            assert client.get(f"unique@{request}") is None
            client.set(f"unique@{request}", VALUE)
        losing = reconcile_at(k8s, namespace, 2)
        assert offload_effective(losing) == ("False", "DoesNotPay"), losing.status["offload"]
        offload = losing.status["offload"]
        assert (offload["hitRatio"], offload["lookups"], offload["unreadShare"]) == ("0.000", 400, "1.000")
        assert float(offload["missOverheadSeconds"]) > 0 and offload["loadedBytes"] == 0
        assert ("Warning", "DoesNotPay") in [(e[0], e[1]) for e in losing.events]
        assert printed(k8s, namespace)["Offload"] == "DoesNotPay"

        for chunk in range(5):
            client.get(f"doc@{chunk}")
        trickle = reconcile_at(k8s, namespace, 3)
        assert offload_effective(trickle) == ("Unknown", "InsufficientData")
        assert trickle.status["offload"]["lookups"] == 5
    finally:
        delete_quietly(k8s, "v1", "Node", node, None)
