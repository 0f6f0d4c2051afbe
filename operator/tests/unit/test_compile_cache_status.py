"""status.compileCache as a pure function of the consumer pods' restore reports (their init container's
termination message) and the capture reports read from their sidecars' logs: hits and misses of the live engines,
the captures still awaited, the keys the store holds, the Event of a new key (at capture time) and of a capture
that failed."""

from __future__ import annotations

import datetime
import json
from typing import Any

from strata_loader.contract import CompileCaptureReport, CompileRestoreReport
from strata_operator.resources.modelcache.compile_cache import (
    CAPTURE_CONTAINER,
    CAPTURE_FAILED_EVENT,
    CAPTURE_POLL_SECONDS,
    CAPTURED_EVENT,
    LOGS_FORBIDDEN_EVENT,
    MAX_ENTRIES,
    RESTORE_CONTAINER,
    CaptureLogs,
    awaited_captures,
    captured_at,
    compile_status,
    engine_reports,
    pods_to_read,
    restore_report,
)
from strata_operator.resources.modelcache.draft import Plan
from strata_operator.resources.modelcache.observed import Observed
from strata_operator.resources.modelcache.owner import CacheRef
from strata_operator.resources.modelcache.plan import plan

KEY_A, KEY_B = "a" * 64, "b" * 64
GEN_1 = "gen-1764979200000000000-0123abcd"  # 2025-12-06T00:00:00Z
GEN_2 = "gen-1764982800000000000-89abcdef"  # an hour later
STORE = "claim llama-model, .strata-compile-cache/"
ENTRY_A = {
    "key": KEY_A,
    "summary": "vllm 0.33.0, torch 2.14.0, cuda:sm_90",
    "generation": GEN_1,
    "captured": "2025-12-06T00:00:00Z",
    "bytes": 3 * 2**20,
    "size": "3.0MiB",
    "files": 12,
}
"""KEY_A's entry in status.compileCache.caches, as `report("restored")` or `capture("captured")` reports it."""


def report(event: str, key: str | None = KEY_A, **fields: Any) -> str:
    if event == "restored":
        fields = {"generation": GEN_1, "files": 12, "bytes": 3 * 2**20, **fields}
    return CompileRestoreReport(
        event=event, key=key, summary="vllm 0.33.0, torch 2.14.0, cuda:sm_90", **fields
    ).to_termination_message()  # type: ignore[arg-type]


def engine_pod(
    name: str,
    message: str | None,
    *,
    phase: str = "Running",
    node: str = "n1",
    last: bool = False,
    capturing: bool = False,
) -> dict[str, Any]:
    """A wired engine's pod as the kubelet reports it; `capturing`: its capture sidecar runs."""
    terminated = {"exitCode": 0, "message": message} if message is not None else None
    state = {"terminated": terminated} if terminated else {"running": {}}
    statuses = [{"name": RESTORE_CONTAINER, "lastState" if last else "state": state}]
    if capturing:
        statuses.append({"name": CAPTURE_CONTAINER, "state": {"running": {"startedAt": "2026-12-06T07:00:00Z"}}})
    return {
        "metadata": {"name": name, "creationTimestamp": f"2026-12-06T07:{len(name):02d}:00Z", "uid": name},
        "spec": {"nodeName": node},
        "status": {"phase": phase, "initContainerStatuses": statuses},
    }


def capture(event: str, key: str = KEY_A, **fields: Any) -> CompileCaptureReport:
    """A capture sidecar's report, read back from its log line as the operator reads it."""
    if event in ("captured", "unchanged"):
        fields = {"generation": GEN_1, "files": 12, "bytes": 3 * 2**20, **fields}
    line = CompileCaptureReport(event=event, key=key, summary="vllm 0.33.0, torch 2.14.0, cuda:sm_90", **fields)  # type: ignore[arg-type]
    parsed = CompileCaptureReport.from_log(f"torch noise\n{line.model_dump_json(exclude_none=True)}\n")
    assert parsed is not None
    return parsed


def test_hits_and_misses_are_counted_over_the_live_engines() -> None:
    pods = [
        engine_pod("a", report("restored")),
        engine_pod("bb", report("miss", reason="target differs (this engine: 'cuda:sm_80', the cache: 'cuda:sm_90')")),
        engine_pod("ccc", report("restored")),
        engine_pod("dddd", report("miss", reason="old"), phase="Succeeded"),  # ended: no longer an engine
        engine_pod("eeeee", None),  # its restore has not ended
    ]
    status, _ = compile_status({}, pods, store=STORE, per_node=False)
    assert (status["hits"], status["misses"]) == (2, 1)
    assert status["lastMiss"] == "pod bb: target differs (this engine: 'cuda:sm_80', the cache: 'cuda:sm_90')"
    assert status["summary"] == "1 key, 2 hits, 1 miss" and status["store"] == STORE


def test_a_key_seen_first_is_recorded_with_one_event_and_kept_when_its_pods_go() -> None:
    status, events = compile_status({}, [engine_pod("a", report("restored"))], store=STORE, per_node=False)
    assert status["caches"] == [ENTRY_A]
    assert [(kind, reason) for kind, reason, _ in events] == [("Normal", CAPTURED_EVENT)]
    assert KEY_A[:12] in events[0][2] and "pod a started from it" in events[0][2]
    previous = {"compileCache": status}
    again, events = compile_status(previous, [engine_pod("b", report("restored"))], store=STORE, per_node=False)
    assert events == [] and again["caches"] == status["caches"]
    gone, events = compile_status(previous, [], store=STORE, per_node=False)
    assert events == [] and gone["caches"] == status["caches"] and (gone["hits"], gone["misses"]) == (0, 0)


def test_a_newer_generation_of_a_key_replaces_the_older_and_the_newest_capture_comes_first() -> None:
    pods = [
        engine_pod("a", report("restored")),
        engine_pod("bb", report("restored", generation=GEN_2, bytes=5 * 2**20)),
        engine_pod("ccc", report("restored", key=KEY_B, generation=GEN_1)),
    ]
    status, events = compile_status({}, pods, store=STORE, per_node=False)
    assert [(c["key"], c["generation"]) for c in status["caches"]] == [(KEY_A, GEN_2), (KEY_B, GEN_1)]
    assert status["caches"][0]["size"] == "5.0MiB" and len(events) == 2


def test_a_miss_without_a_key_and_a_message_that_is_not_a_report_count_as_they_are() -> None:
    pods = [engine_pod("a", report("miss", key=None, reason="compile key: not JSON")), engine_pod("bb", "Killed")]
    status, events = compile_status({}, pods, store=STORE, per_node=False)
    assert (status["hits"], status["misses"], status["caches"], events) == (0, 1, [], [])


def test_node_local_lists_the_nodes_whose_store_holds_the_key() -> None:
    pods = [engine_pod("a", report("restored"), node="n2"), engine_pod("bb", report("restored"), node="n1")]
    status, _ = compile_status({}, pods, store="x", per_node=True)
    assert status["caches"][0]["nodes"] == ["n1", "n2"]


def test_the_list_keeps_the_newest_keys() -> None:
    previous = {
        "compileCache": {
            "caches": [{"key": f"{i:064x}", "captured": f"2026-01-{i + 1:02d}T00:00:00Z"} for i in range(MAX_ENTRIES)]
        }
    }
    status, _ = compile_status(
        previous, [engine_pod("a", report("restored", generation=GEN_2))], store=STORE, per_node=False
    )
    assert len(status["caches"]) == MAX_ENTRIES
    assert status["caches"][0]["key"] == f"{MAX_ENTRIES - 1:064x}"  # 2026 is newer than the capture of 2025
    assert KEY_A not in [c["key"] for c in status["caches"]]  # the oldest capture fell off


def test_a_restarted_restore_reports_from_its_last_state() -> None:
    assert restore_report(engine_pod("a", report("restored"), last=True)) is not None
    assert restore_report(engine_pod("a", None)) is None
    assert captured_at("gen-x-1") is None and captured_at(GEN_1) == "2025-12-06T00:00:00Z"


def test_the_plan_reports_the_compile_cache_only_when_it_is_on() -> None:
    from strata_operator.api.modelcache import ModelCacheSpec

    owner = CacheRef("llama", "serving", "u1", generation=1)
    spec = {"source": {"uri": "s3://models/llama"}, "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}}}
    now = datetime.datetime(2026, 12, 6, tzinfo=datetime.UTC)
    pods = [engine_pod("a", report("restored"))]
    off = plan(Observed(owner, {}, now, spec=ModelCacheSpec.model_validate(spec), consumer_pods=pods))
    assert "compileCache" not in off.status
    on_spec = ModelCacheSpec.model_validate({**spec, "compileCache": {"enabled": True}})
    on = plan(Observed(owner, {}, now, spec=on_spec, consumer_pods=pods))
    assert on.status["compileCache"]["store"] == STORE and on.status["compileCache"]["hits"] == 1
    assert CAPTURED_EVENT in [reason for _, reason, _ in on.events]


MISSED = report("miss", reason="holds no compile cache yet")


def test_an_engine_that_missed_awaits_its_capture_and_its_log_is_read_once_the_sidecar_runs() -> None:
    pods = [
        engine_pod("a", MISSED, capturing=True),
        engine_pod("bb", MISSED),  # its sidecar has not started: nothing to read yet, but awaited
        engine_pod("ccc", report("restored", key=KEY_B)),  # a hit captures nothing
        engine_pod("dddd", report("miss", key=None, reason="compile key: not JSON"), capturing=True),  # no key
    ]
    assert awaited_captures({}, engine_reports(pods)) == ["a", "bb"] and pods_to_read({}, pods) == ["a"]
    status, events = compile_status({}, pods, store=STORE, per_node=False)
    assert status["capturing"] == 2 and [reason for _, reason, _ in events] == [CAPTURED_EVENT]  # KEY_B's restore
    # once the store holds the key (status says so), nobody is awaited any more
    held = {"compileCache": {"caches": [{"key": KEY_A}]}}
    assert awaited_captures(held["compileCache"], engine_reports(pods)) == [] and pods_to_read(held, pods) == []


def test_the_captures_status_counts_as_awaited_are_the_ones_the_next_round_reads() -> None:
    """status.compileCache.capturing and the next round's log reads agree: a capture reported now ends the wait of
    every engine that missed its key, a failed one ends its own, in the count and in the reads alike."""
    missed_b = report("miss", key=KEY_B, reason="holds no compile cache yet")
    pods = [
        engine_pod("a", MISSED, capturing=True),
        engine_pod("bb", MISSED, capturing=True),  # a's key: a's capture ends its wait too
        engine_pod("ccc", missed_b, capturing=True),
        engine_pod("dddd", missed_b),  # awaited, but its sidecar has not started: nothing to read yet
        engine_pod("eeeee", missed_b, capturing=True),
    ]
    refused = capture("refused", key=KEY_B, reason="the store would hold 21.0GiB, over its limit of 20.0GiB")
    logs = CaptureLogs({"a": capture("captured"), "eeeee": refused}, asked=True)
    status, _ = compile_status({}, pods, store=STORE, per_node=False, logs=logs)
    assert status["capturing"] == 2 and pods_to_read({"compileCache": status}, pods) == ["ccc"]


def test_a_capture_is_recorded_with_its_event_when_the_sidecar_reports_it_not_when_an_engine_restores_it() -> None:
    pods = [engine_pod("a", MISSED, capturing=True, node="n2")]
    status, events = compile_status({}, pods, store=STORE, per_node=True, logs=CaptureLogs({"a": capture("captured")}))
    assert status["caches"] == [{**ENTRY_A, "nodes": ["n2"]}]
    assert status["capturing"] == 0 and (status["hits"], status["misses"]) == (0, 1)
    ((kind, reason, message),) = events
    assert (kind, reason) == ("Normal", CAPTURED_EVENT)
    assert message == (
        f"compile cache {KEY_A[:12]} (vllm 0.33.0, torch 2.14.0, cuda:sm_90, 3.0MiB) is stored: captured from pod a"
        " on node n2"
    )
    # the next engine restores it: a hit, and no second Event
    later = [*pods, engine_pod("bb", report("restored"), node="n2")]
    again, events = compile_status({"compileCache": status}, later, store=STORE, per_node=True)
    assert events == [] and again["caches"] == status["caches"] and again["hits"] == 1


def test_a_key_another_engine_stored_first_is_recorded_without_claiming_the_capture() -> None:
    pods = [engine_pod("a", MISSED, capturing=True)]
    status, events = compile_status({}, pods, store=STORE, per_node=False, logs=CaptureLogs({"a": capture("present")}))
    assert status["caches"] == [{"key": KEY_A, "summary": "vllm 0.33.0, torch 2.14.0, cuda:sm_90"}]
    assert status["capturing"] == 0
    assert events[0][2] == (
        f"compile cache {KEY_A[:12]} (vllm 0.33.0, torch 2.14.0, cuda:sm_90) is stored:"
        " pod a on node n1 found it stored"
    )


def test_a_failed_capture_is_listed_while_its_pod_lives_with_one_warning_and_is_not_read_again() -> None:
    pods = [engine_pod("a", MISSED, capturing=True)]
    refused = capture("refused", reason="the store would hold 21.0GiB, over its limit of 20.0GiB")
    status, events = compile_status({}, pods, store=STORE, per_node=False, logs=CaptureLogs({"a": refused}))
    assert status["captureFailures"] == [{"pod": "a", "key": KEY_A, "outcome": "refused", "reason": refused.reason}]
    assert status["capturing"] == 0 and status["caches"] == []
    ((kind, reason, message),) = events
    assert (kind, reason) == ("Warning", CAPTURE_FAILED_EVENT) and refused.reason in message and "pod a" in message
    previous = {"compileCache": status}
    assert pods_to_read(previous, pods) == []  # its log says nothing new: not read again
    again, events = compile_status(previous, pods, store=STORE, per_node=False, logs=CaptureLogs({"a": refused}))
    assert events == [] and again["captureFailures"] == status["captureFailures"]
    gone, _ = compile_status(previous, [], store=STORE, per_node=False)
    assert "captureFailures" not in gone  # the pod went: so did its failure


def test_a_capture_report_is_found_in_a_log_whatever_else_it_holds() -> None:
    line = json.dumps({"event": "captured", "key": KEY_A, "generation": GEN_1, "files": 3, "bytes": 10})
    log = f'strata-loader compile: error: x\n{line}\n{{"cut'
    found = CompileCaptureReport.from_log(log)
    assert found is not None and (found.event, found.files, found.failed) == ("captured", 3, False)
    assert CompileCaptureReport.from_log("nothing yet\n") is None
    assert CompileCaptureReport.from_log('{"event": "restored"}') is None  # not a capture's report


def planned_with_capture_awaited(previous: dict[str, Any], logs: CaptureLogs | None = None) -> Plan:
    """The plan of a SharedPVC cache with compileCache on, whose one engine missed and its sidecar runs."""
    from strata_operator.api.modelcache import ModelCacheSpec

    owner = CacheRef("llama", "serving", "u1", generation=1)
    spec = {
        "source": {"uri": "s3://models/llama"},
        "storage": {"mode": "SharedPVC", "sharedPVC": {"size": "1Gi"}},
        "compileCache": {"enabled": True},
    }
    parsed = ModelCacheSpec.model_validate(spec)
    now = datetime.datetime(2026, 12, 6, tzinfo=datetime.UTC)
    pods = [engine_pod("a", MISSED, capturing=True)]
    return plan(Observed(owner, previous, now, spec=parsed, consumer_pods=pods, capture_logs=logs or CaptureLogs()))


def test_the_plan_asks_for_a_recheck_only_while_a_capture_is_awaited() -> None:
    awaiting = planned_with_capture_awaited({})
    assert awaiting.recheck_seconds == CAPTURE_POLL_SECONDS
    done = planned_with_capture_awaited({}, CaptureLogs({"a": capture("captured")}, asked=True))
    assert done.recheck_seconds is None and CAPTURED_EVENT in [reason for _, reason, _ in done.events]


FORBIDDEN = (
    'pods "a" is forbidden: User "system:serviceaccount:strata:strata" cannot get resource "pods/log" in API group'
    ' "" in the namespace "serving"'
)
"""The API server's message for a log read its RBAC refuses."""


def test_logs_the_api_server_refuses_are_said_once_and_the_capture_stays_awaited_until_a_read_is_allowed() -> None:
    pods = [engine_pod("a", MISSED, capturing=True)]
    refused = CaptureLogs(asked=True, forbidden=FORBIDDEN)
    status, events = compile_status({}, pods, store=STORE, per_node=False, logs=refused)
    assert status["capturing"] == 1 and status["caches"] == []
    said = status["captureLogsForbidden"]
    assert FORBIDDEN in said and "get on pods/log in this namespace" in said and "docs/security.md" in said
    assert events == [("Warning", LOGS_FORBIDDEN_EVENT, said)]
    refused_again, events = compile_status({"compileCache": status}, pods, store=STORE, per_node=False, logs=refused)
    assert refused_again["captureLogsForbidden"] == said and events == []  # once, not at every read
    # a round that asked nothing (no started sidecar to read) knows no better: it keeps what it knew
    unasked, events = compile_status({"compileCache": status}, pods, store=STORE, per_node=False)
    assert unasked["captureLogsForbidden"] == said and events == []
    # granted: the next read is allowed, whether or not the log holds a report yet
    allowed, events = compile_status(
        {"compileCache": status}, pods, store=STORE, per_node=False, logs=CaptureLogs(asked=True)
    )
    assert "captureLogsForbidden" not in allowed and allowed["capturing"] == 1 and events == []
    # nothing awaited any more (the pod went): nothing left to say
    gone, _ = compile_status({"compileCache": status}, [], store=STORE, per_node=False)
    assert "captureLogsForbidden" not in gone


def test_while_the_logs_are_refused_the_plan_reads_them_at_the_resync_and_polls_again_once_allowed() -> None:
    refused = planned_with_capture_awaited({}, CaptureLogs(asked=True, forbidden=FORBIDDEN))
    assert refused.recheck_seconds is None  # the resync, not CAPTURE_POLL_SECONDS
    assert LOGS_FORBIDDEN_EVENT in [reason for _, reason, _ in refused.events]
    allowed = planned_with_capture_awaited(refused.status, CaptureLogs(asked=True))
    assert (
        allowed.recheck_seconds == CAPTURE_POLL_SECONDS and "captureLogsForbidden" not in allowed.status["compileCache"]
    )
