"""Which child events make the KVCacheTier controller act, and how much."""

from __future__ import annotations

from typing import Any

from strata_operator.handlers import controller
from strata_operator.handlers.kvcachetier import reconcile as reconciler
from strata_operator.handlers.kvcachetier.events import child_event_action, owning_tier


def child(
    kind: str = "DaemonSet", rv: str = "10", generation: int = 2, owner_kind: str = "KVCacheTier"
) -> dict[str, Any]:
    return {
        "kind": kind,
        "metadata": {
            "name": "kv",
            "namespace": "ns",
            "resourceVersion": rv,
            "generation": generation,
            "ownerReferences": [
                {"apiVersion": "strata.dev/v1alpha1", "kind": owner_kind, "name": "kv", "uid": "u", "controller": True}
            ],
        },
    }


APPLIED: reconciler.AppliedChildren = {
    ("DaemonSet", "ns", "kv"): reconciler.Applied("10", 2),
    ("ConfigMap", "ns", "kv"): reconciler.Applied("11", 0),
}


def test_owner_is_the_controlling_tier() -> None:
    assert owning_tier(child()) == "kv"
    assert owning_tier(child(owner_kind="ModelCache")) is None
    assert owning_tier({"metadata": {}}) is None


def test_our_own_creations_and_writes_are_ignored() -> None:
    assert child_event_action(None, child(), APPLIED) == "skip"
    assert child_event_action("ADDED", child(), APPLIED) == "skip"
    assert child_event_action("MODIFIED", child(rv="10"), APPLIED) == "skip"
    assert child_event_action("MODIFIED", child("ConfigMap", rv="11"), APPLIED) == "skip"


def test_daemonset_status_updates_only_refresh_status() -> None:
    assert child_event_action("MODIFIED", child(rv="12", generation=2), APPLIED) == "status"


def test_hand_edits_and_deletions_reapply() -> None:
    assert child_event_action("MODIFIED", child(rv="12", generation=3), APPLIED) == "full"
    assert child_event_action("MODIFIED", child("ConfigMap", rv="12"), APPLIED) == "full"
    assert child_event_action("DELETED", child(), APPLIED) == "full"
    assert child_event_action("MODIFIED", child("Service", rv="1"), APPLIED) == "full"


def test_unforeseen_failures_back_off_instead_of_retrying_every_five_seconds() -> None:
    """Both controllers' daemons wait this long after consecutive failures (a wake-up ends the wait)."""
    delays = [controller.backoff_seconds(n) for n in range(1, 13)]
    assert delays[0] == 2 and delays == sorted(delays) and delays[-1] == controller.MAX_BACKOFF_SECONDS


def test_a_consumer_pod_event_wakes_the_daemon_only_when_the_count_moved() -> None:
    """The daemon counts its live consumers from kopf's pod index into status.consumers; a pod event (the index
    already updated) wakes it only when that count differs from what its last reconcile read."""
    index: dict[tuple[str, str], list[str]] = {("ns", "kv"): ["a", "b"]}
    waker, key = controller.Waker(), ("ns", "kv")
    assert controller.consumers_moved(index, waker, key), "never counted: the first reconcile writes it"  # type: ignore[arg-type]
    assert controller.count_consumers(index, waker, key) == 2  # type: ignore[arg-type]
    assert not controller.consumers_moved(index, waker, key)  # type: ignore[arg-type]
    index[key] = ["a"]
    assert controller.consumers_moved(index, waker, key)  # type: ignore[arg-type]
    del index[key]
    assert controller.count_consumers(index, waker, key) == 0  # type: ignore[arg-type]


def test_the_consumer_index_leaves_out_pods_that_ended_or_are_going() -> None:
    index = controller.consumer_index(controller.KV_TIERS)
    labels = {controller.KV_TIERS.label: "kv"}
    assert index(namespace="ns", name="p", labels=labels, status={"phase": "Running"}, meta={}) == {("ns", "kv"): "p"}
    assert index(namespace="ns", name="p", labels=labels, status={"phase": "Succeeded"}, meta={}) is None
    going = {"deletionTimestamp": "2026-01-01T00:00:00Z"}
    assert index(namespace="ns", name="p", labels=labels, status={"phase": "Running"}, meta=going) is None
