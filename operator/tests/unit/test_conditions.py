"""Conditions follow the Kubernetes conventions kstatus, Flux and Argo CD read."""

from strata_operator.conditions import get_condition, is_true, set_condition


def test_new_condition_is_appended_with_generation() -> None:
    result = set_condition([], "Ready", False, "Preloading", "copying", generation=3, now="T1")
    assert result == [
        {
            "type": "Ready",
            "status": "False",
            "reason": "Preloading",
            "message": "copying",
            "lastTransitionTime": "T1",
            "observedGeneration": 3,
        }
    ]


def test_transition_time_moves_only_when_status_changes() -> None:
    first = set_condition([], "Ready", False, "Preloading", "copying", generation=1, now="T1")
    same = set_condition(first, "Ready", False, "Preloading", "still copying", generation=2, now="T2")
    assert same[0]["lastTransitionTime"] == "T1"
    assert same[0]["message"] == "still copying" and same[0]["observedGeneration"] == 2
    flipped = set_condition(same, "Ready", True, "Loaded", "done", generation=2, now="T3")
    assert flipped[0]["lastTransitionTime"] == "T3"
    assert is_true(flipped, "Ready")


def test_other_conditions_are_untouched() -> None:
    conditions = set_condition([], "Degraded", False, "AsExpected", "", generation=1, now="T0")
    conditions = set_condition(conditions, "Ready", True, "Loaded", "", generation=1, now="T1")
    assert [c["type"] for c in conditions] == ["Degraded", "Ready"]
    degraded = get_condition(conditions, "Degraded")
    assert degraded is not None and degraded["lastTransitionTime"] == "T0"
    assert not is_true(conditions, "Missing")
