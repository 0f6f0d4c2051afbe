"""Status as a pure function: Job states, termination messages, verification, conditions and minimal patches."""

from __future__ import annotations

from typing import Any

import pytest
from strata_loader.contract import FetchResult
from strata_operator.conditions import transition_events
from strata_operator.resources.core import Problem, status_patch
from strata_operator.resources.modelcache import status as st
from strata_units import format_bytes

RESULT = FetchResult(source="s3://models/llama", revision="main", bytes=3 * 2**30, files=4, seconds=12.5)


def job(*conditions: tuple[str, str]) -> dict[str, Any]:
    return {"status": {"conditions": [{"type": t, "status": s} for t, s in conditions]}}


def pod(phase: str, message: str | None, created: str) -> dict[str, Any]:
    terminated = {"exitCode": 0 if phase == "Succeeded" else 1, **({"message": message} if message else {})}
    return {
        "metadata": {"creationTimestamp": created},
        "status": {"phase": phase, "containerStatuses": [{"name": "fetch", "state": {"terminated": terminated}}]},
    }


def test_job_phase_reads_terminal_conditions() -> None:
    assert st.job_phase(None) == st.JOB_MISSING
    assert st.job_phase(job()) == st.JOB_RUNNING
    assert st.job_phase(job(("Complete", "True"))) == st.JOB_SUCCEEDED
    assert st.job_phase(job(("SuccessCriteriaMet", "True"))) == st.JOB_SUCCEEDED
    assert st.job_phase(job(("Failed", "True"))) == st.JOB_FAILED
    assert st.job_phase(job(("Failed", "False"))) == st.JOB_RUNNING


def test_termination_message_comes_from_the_newest_pod_that_ended_like_the_job() -> None:
    pods = [
        pod("Failed", "first try", "2026-01-01T00:00:00Z"),
        pod("Succeeded", "old", "2026-01-01T00:00:01Z"),
        pod("Succeeded", "new", "2026-01-01T00:00:02Z"),
    ]
    assert st.termination_message(pods, "fetch", succeeded=True) == "new"
    assert st.termination_message(pods, "fetch", succeeded=False) == "first try"
    assert st.termination_message([pod("Succeeded", None, "x")], "fetch", succeeded=True) is None


def test_a_result_is_verified_against_the_spec() -> None:
    assert st.verify_result(RESULT, "s3://models/llama", "main") is None
    assert "not 's3://other/x'" in (st.verify_result(RESULT, "s3://other/x", None) or "")
    assert "revision" in (st.verify_result(RESULT, "s3://models/llama", "v2") or "")
    empty = RESULT.model_copy(update={"files": 0})
    assert "no files" in (st.verify_result(empty, "s3://models/llama", None) or "")
    failed = FetchResult(status="Failed", error="AccessDenied on s3://models/llama")
    assert st.verify_result(failed, "s3://models/llama", None) == "AccessDenied on s3://models/llama"


def test_an_hf_branch_or_tag_comes_back_as_the_commit_it_named() -> None:
    commit = "a" * 40
    hub = RESULT.model_copy(update={"source": "hf://acme/tiny", "revision": commit})
    assert st.verify_result(hub, "hf://acme/tiny", "main") is None
    assert st.verify_result(hub, "hf://acme/tiny", commit) is None
    assert "revision" in (st.verify_result(hub, "hf://acme/tiny", "b" * 40) or "")  # a pinned commit must match
    not_a_commit = hub.model_copy(update={"revision": "v2"})
    assert "revision" in (st.verify_result(not_a_commit, "hf://acme/tiny", "main") or "")
    assert "revision" in (st.verify_result(hub.model_copy(update={"source": ""}), "s3://models/llama", "main") or "")


def test_an_unreadable_termination_message_is_a_failed_result() -> None:
    result = FetchResult.from_termination_message("Traceback: boom")
    assert st.verify_result(result, "s3://models/llama", None) is not None


def test_result_fields_are_human_friendly() -> None:
    fields = st.result_fields(RESULT)
    assert fields["size"] == "3.0GiB" and fields["totalFiles"] == 4 and fields["resolvedRevision"] == "main"
    assert format_bytes(512, approximate=True) == "512B"


def test_render_status_keeps_transition_times_while_nothing_flips() -> None:
    outcome = st.preloading_outcome({"job": "j"}, "copying")
    first = st.render_status({}, outcome, 3, now="2026-01-01T00:00:00Z")
    second = st.render_status(first, outcome, 3, now="2026-01-01T00:05:00Z")
    assert first == second
    assert {c["type"]: c["status"] for c in first["conditions"]} == {
        "Ready": "False",
        "Reconciling": "True",
        "Stalled": "False",
        "Degraded": "False",
    }
    assert all(c["observedGeneration"] == 3 for c in first["conditions"])
    assert first["phase"] == "Preloading" and first["observedGeneration"] == 3


def test_one_vocabulary_with_kvcachetier_stalled_waits_for_a_person() -> None:
    """Ready, Reconciling and Stalled as kstatus reads them; Degraded is ModelCache's own. A condition type an
    older operator wrote is dropped."""
    previous = {"conditions": [{"type": "Progressing", "status": "True", "reason": "Preloading", "message": ""}]}
    blocked = st.render_status(previous, st.blocked_outcome(Problem("SecretNotFound", "no secret"), {}), 1)
    kinds = {c["type"]: (c["status"], c["reason"]) for c in blocked["conditions"]}
    assert kinds == {
        "Ready": ("False", "SecretNotFound"),
        "Reconciling": ("False", "SecretNotFound"),
        "Stalled": ("True", "SecretNotFound"),
        "Degraded": ("True", "SecretNotFound"),
    }


@pytest.mark.parametrize("ready", [True, False])
@pytest.mark.parametrize("reconciling", [True, False])
@pytest.mark.parametrize("degraded", [True, False])
def test_stalled_is_degraded_with_nothing_in_progress_usable_or_not(
    ready: bool, reconciling: bool, degraded: bool
) -> None:
    """Flux says Failed when Degraded (kstatus reads Stalled), unless Reconciling: then something in progress may
    mend it (a node that returns, a retry), and Flux says InProgress. Ready does not enter into it: a cache
    usable while a pre-pull failed is still a failure for a person to look at. So Reconciling and Stalled are
    never both True (kstatus would take whichever was written first)."""
    outcome = st.Outcome(
        phase="any",
        ready=(ready, "R", "ready message"),
        reconciling=(reconciling, "Working", "in progress"),
        degraded=(degraded, "PrePullFailed", "gpu-a: ErrImagePull") if degraded else (False, "AsExpected", ""),
    )
    conditions = {c["type"]: c for c in st.render_status({}, outcome, 1)["conditions"]}
    expected = degraded and not reconciling
    assert conditions["Stalled"]["status"] == ("True" if expected else "False")
    if expected:
        assert (conditions["Stalled"]["reason"], conditions["Stalled"]["message"]) == (
            "PrePullFailed",
            "gpu-a: ErrImagePull",
        )


def test_status_patch_is_none_when_nothing_changed_and_drops_stale_keys() -> None:
    previous = {"phase": "Ready", "job": "old", "size": "1GiB"}
    assert status_patch(previous, dict(previous)) is None
    assert status_patch(previous, {"phase": "Ready", "job": "new"}) == {"job": "new", "size": None}


def events(previous: dict[str, Any], desired: dict[str, Any]) -> list[tuple[str, str, str]]:
    return transition_events("ModelCache", previous["conditions"], desired["conditions"])


def test_events_only_on_transitions() -> None:
    ready = st.render_status({}, st.ready_outcome({}, "done"), 1, now="t0")
    preloading = st.render_status({}, st.preloading_outcome({}, "copying"), 1, now="t0")
    assert [e[1] for e in events(preloading, ready)] == ["Preloaded"]
    assert events(ready, ready) == []
    failed = st.render_status({}, st.failed_outcome({}, "PreloadFailed", "AccessDenied"), 1, now="t0")
    assert events(preloading, failed) == [("Warning", "PreloadFailed", "AccessDenied")]


def test_node_events_when_a_node_settles() -> None:
    before = {"nodes": [{"name": "a", "phase": "Preloading"}]}
    after = {"nodes": [{"name": "a", "phase": "Ready", "message": "verified copy: 4 files"}]}
    assert st.node_events(before, after) == [("Normal", "NodeReady", "node a: verified copy: 4 files")]


def test_per_node_states_roll_up_into_phase_and_conditions() -> None:
    def states(*phases: str) -> list[dict[str, Any]]:
        return [{"name": f"n{i}", "phase": p, "message": "m"} for i, p in enumerate(phases)]

    all_ready = st.nodes_outcome(states("Ready", "Ready"), ready_reason="AllNodesReady", ready_message="", fields={})
    assert all_ready.phase == "Ready" and all_ready.ready[0] and not all_ready.reconciling[0]
    partial = st.nodes_outcome(states("Ready", "Preloading"), ready_reason="R", ready_message="", fields={})
    assert partial.phase == "Preloading" and partial.reconciling[0] and not partial.ready[0]
    some_failed = st.nodes_outcome(states("Ready", "Failed"), ready_reason="R", ready_message="", fields={})
    assert some_failed.phase == "Degraded" and some_failed.degraded[:2] == (True, "NodePreloadFailed")
    all_failed = st.nodes_outcome(states("Failed"), ready_reason="R", ready_message="", fields={})
    assert all_failed.phase == "Failed"
