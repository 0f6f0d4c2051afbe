"""Which child events make the KVCacheTier controller act, and how much."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from strata_operator.handlers import kvcachetier_reconcile as reconciler
from strata_operator.handlers.kvcachetier import child_event_action, owning_tier


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


@pytest.fixture(autouse=True)
def applied() -> Iterator[None]:
    reconciler.applied_children.clear()
    reconciler.applied_children[("DaemonSet", "ns", "kv")] = reconciler.Applied("10", 2)
    reconciler.applied_children[("ConfigMap", "ns", "kv")] = reconciler.Applied("11", 0)
    yield
    reconciler.applied_children.clear()


def test_owner_is_the_controlling_tier() -> None:
    assert owning_tier(child()) == "kv"
    assert owning_tier(child(owner_kind="ModelCache")) is None
    assert owning_tier({"metadata": {}}) is None


def test_our_own_creations_and_writes_are_ignored() -> None:
    assert child_event_action(None, child()) == "skip"
    assert child_event_action("ADDED", child()) == "skip"
    assert child_event_action("MODIFIED", child(rv="10")) == "skip"
    assert child_event_action("MODIFIED", child("ConfigMap", rv="11")) == "skip"


def test_daemonset_status_updates_only_refresh_status() -> None:
    assert child_event_action("MODIFIED", child(rv="12", generation=2)) == "status"


def test_hand_edits_and_deletions_reapply() -> None:
    assert child_event_action("MODIFIED", child(rv="12", generation=3)) == "full"
    assert child_event_action("MODIFIED", child("ConfigMap", rv="12")) == "full"
    assert child_event_action("DELETED", child()) == "full"
    assert child_event_action("MODIFIED", child("Service", rv="1")) == "full"


def test_unforeseen_failures_back_off_instead_of_retrying_every_five_seconds() -> None:
    from strata_operator.handlers.kvcachetier import MAX_RETRY_DELAY_SECONDS, retry_delay

    delays = [retry_delay(n) for n in range(12)]
    assert delays[0] == 5 and delays == sorted(delays) and delays[-1] == MAX_RETRY_DELAY_SECONDS
