"""status.compileCache: what the engines' restore and capture containers reported, as a pure function of the
consumer pods and the capture reports read from their sidecars' logs.

Each wired engine's `strata-compile-restore` init container ends with a `contract.CompileRestoreReport` in its
termination message (restored, with the key, generation and size; or a miss with its reason). Counted over the
live consumer pods these are the hits and misses.

An engine that missed compiles, and its `strata-compile-capture` sidecar stores the result. That sidecar runs
until its pod stops (a native sidecar that exits is restarted and takes the pod out of Ready), so it has no
termination message while the engine serves: it prints a `contract.CompileCaptureReport` as its last log line,
and the operator reads the log of each capture still awaited (`awaited_captures`, a few lines by
`handlers/modelcache/io.read_capture_logs`) every `CAPTURE_POLL_SECONDS` until it says how it ended. A key
seen for the first time, captured or restored, is recorded in `caches` (kept when its pods go) with an Event
`CompileCacheCaptured`; a capture that failed is listed in `captureFailures` while its pod lives, with a Warning
Event `CompileCaptureFailed`. Where the API server refuses the operator those logs (its RBAC lacks `get pods/log`,
an older chart or a Role of its own), `captureLogsForbidden` says so with one Warning `CaptureLogsForbidden`, the
captures stay awaited, and the logs are tried again at the resync instead of every `CAPTURE_POLL_SECONDS`.
"""

from __future__ import annotations

import datetime
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata_loader.contract import CompileCaptureReport, CompileRestoreReport
from strata_units import format_bytes

from strata_operator.api.modelcache import ModelCacheSpec, StorageMode
from strata_operator.resources.core import Event
from strata_operator.resources.modelcache import capacity, storage
from strata_operator.resources.modelcache.owner import CacheRef

COMPILE_STORE_DIR = ".strata-compile-cache"
"""The store's directory in the model's storage: at the claim's root (SharedPVC) or in the node's copy
(NodeLocal), so the model's own clean-up (the claim deleted with the cache, the node copy's `rm -rf`) removes it."""
RESTORE_CONTAINER = "strata-compile-restore"
"""The init container whose termination message reports a hit or a miss (the webhook adds it)."""
CAPTURE_CONTAINER = "strata-compile-capture"
"""The native sidecar that stores a missed engine's compile output; its last log line reports how that went."""
MAX_ENTRIES = 16
CAPTURED_EVENT = "CompileCacheCaptured"
CAPTURE_FAILED_EVENT = "CompileCaptureFailed"
LOGS_FORBIDDEN_EVENT = "CaptureLogsForbidden"
LOG_READS_PER_ROUND = 8
"""Sidecar logs read in one reconcile at most (each is a request the API server passes on to a kubelet)."""
CAPTURE_POLL_SECONDS = 10.0
"""How often the sidecars' logs are read while a capture is awaited: its Event comes at most this late. A capture
finishes `--quiet-seconds` (30 s) after the compiler's last file, so a shorter interval would mostly read nothing
new; one log read per awaited pod, only while its sidecar runs."""
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


@dataclass(frozen=True)
class CaptureLogs:
    """What one reconcile's reads of the awaited captures' sidecar logs found (`handlers/modelcache/io`)."""

    reports: Mapping[str, CompileCaptureReport] = field(default_factory=dict)
    """The capture reports, by pod name (a pod whose log holds none yet is absent)."""
    asked: bool = False
    """Whether any log was asked for: none is while no awaited capture's sidecar has started."""
    forbidden: str | None = None
    """The API server's message when it refused a read (403): the operator may not `get pods/log` here. The reads
    stop there: RBAC grants per namespace, so the other pods' would be refused alike."""


@dataclass(frozen=True)
class EngineReport:
    """One live engine's restore: which pod, on which node, created when, and what it reported."""

    pod: str
    node: str | None
    created: str
    report: CompileRestoreReport


def restore_report(pod: Mapping[str, Any]) -> CompileRestoreReport | None:
    """The report of the pod's restore init container (its last run), or None before it ended."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") != RESTORE_CONTAINER:
            continue
        for state in (status.get("state"), status.get("lastState")):
            message = ((state or {}).get("terminated") or {}).get("message")
            if message:
                return CompileRestoreReport.from_termination_message(str(message))
    return None


def live(pod: Mapping[str, Any]) -> bool:
    """Pending or running, not deleting: an engine that counts (an ended pod is no longer one)."""
    ended = (pod.get("status") or {}).get("phase") in capacity.ENDED_POD_PHASES
    return not ended and not (pod.get("metadata") or {}).get("deletionTimestamp")


def capture_started(pod: Mapping[str, Any]) -> bool:
    """Whether the pod's capture sidecar has run (running now, or ended once): only then can its log say anything."""
    for status in (pod.get("status") or {}).get("initContainerStatuses") or []:
        if status.get("name") == CAPTURE_CONTAINER:
            state = status.get("state") or {}
            return bool(state.get("running") or state.get("terminated") or status.get("lastState"))
    return False


def awaited_captures(compile_cache: Mapping[str, Any], engines: Sequence[EngineReport]) -> list[str]:
    """The live engines whose restore missed for a key `compile_cache` (a status.compileCache) does not hold yet and
    whose capture has not been seen to fail: their sidecar is (or will be) capturing, and its log is read until it
    says how that ended. The one definition of an awaited capture: status counts them, the next round reads them."""
    held = {c.get("key") for c in compile_cache.get("caches") or []}
    failed = {f.get("pod") for f in compile_cache.get("captureFailures") or []}
    awaited = []
    for engine in engines:
        report = engine.report
        if report.event == "miss" and report.key and report.key not in held and engine.pod not in failed:
            awaited.append(engine.pod)
    return awaited


def pods_to_read(previous: Mapping[str, Any], pods: Sequence[Mapping[str, Any]]) -> list[str]:
    """The awaited captures whose sidecar has started, oldest pod first, at most `LOG_READS_PER_ROUND`: the logs
    worth reading now. A fleet that starts at once all misses the same key; the first capture of it ends the
    wait of all the others."""
    started = {str((p.get("metadata") or {}).get("name")) for p in pods if capture_started(p)}
    awaited = awaited_captures(previous.get("compileCache") or {}, engine_reports(pods))
    return [name for name in awaited if name in started][:LOG_READS_PER_ROUND]


def engine_reports(pods: Sequence[Mapping[str, Any]]) -> list[EngineReport]:
    """The reports of the live pods (ended pods are no longer engines), oldest pod first."""
    found = []
    for pod in pods:
        if not live(pod) or (report := restore_report(pod)) is None:
            continue
        meta = pod.get("metadata") or {}
        created = str(meta.get("creationTimestamp") or "")
        found.append(EngineReport(str(meta.get("name")), (pod.get("spec") or {}).get("nodeName"), created, report))
    return sorted(found, key=lambda r: (r.created, r.pod))


def captured_at(generation: str | None) -> str | None:
    """A generation is `gen-<capture time in ns>-<hex>`: its capture time, or None for another name."""
    parts = (generation or "").split("-")
    if len(parts) != 3 or parts[0] != "gen" or not parts[1].isdigit():
        return None
    moment = datetime.datetime.fromtimestamp(int(parts[1]) / 1e9, datetime.UTC)
    return moment.strftime(TIME_FORMAT)


def store_location(owner: CacheRef, spec: ModelCacheSpec) -> str:
    """Where the store is, for people."""
    if spec.storage.mode == StorageMode.SHARED_PVC:
        return f"claim {storage.claim_name(owner, spec)}, {COMPILE_STORE_DIR}/"
    return f"{posixpath.join(storage.node_copy_path(owner, spec), COMPILE_STORE_DIR)}/ on each node"


def _count(n: int, one: str, many: str | None = None) -> str:
    """`1 key`, `2 keys`, `0 misses`: the summary `kubectl get` prints reads as English."""
    return f"{n} {one if n == 1 else many or one + 's'}"


def compile_status(
    previous: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    *,
    store: str,
    per_node: bool,
    logs: CaptureLogs | None = None,
) -> tuple[dict[str, Any], list[Event]]:
    """status.compileCache from the stored one, the consumer pods and what their sidecars' logs said now, and the
    Events of keys seen first now, of captures that failed and of logs the operator may no longer read.
    `per_node`: NodeLocal, where every node has a store of its own (an entry lists the nodes that hold it)."""
    logs = logs or CaptureLogs()
    reports = engine_reports(pods)
    before = previous.get("compileCache") or {}
    caches: dict[str, dict[str, Any]] = {c["key"]: dict(c) for c in before.get("caches") or [] if c.get("key")}
    events: list[Event] = []
    live_pods = {str((p.get("metadata") or {}).get("name")): p for p in pods if live(p)}

    def entry_for(key: str, summary: str | None, size: int | None, how: str) -> dict[str, Any]:
        entry = caches.get(key)
        if entry is None:
            entry = caches[key] = {"key": key}
            about = [summary or "no summary"] + ([format_bytes(size, approximate=True)] if size is not None else [])
            message = f"compile cache {key[:12]} ({', '.join(about)}) is stored: {how}"
            events.append(("Normal", CAPTURED_EVENT, message))
        return entry

    def record(entry: dict[str, Any], summary: str | None, generation: str | None, files: Any, size: Any) -> None:
        if generation and generation >= str(entry.get("generation") or ""):
            entry.update(
                summary=summary or entry.get("summary"),
                generation=generation,
                captured=captured_at(generation),
                bytes=size,
                size=format_bytes(size or 0, approximate=True),
                files=files,
            )
        elif summary and not entry.get("summary"):
            entry["summary"] = summary

    def held_on(entry: dict[str, Any], node: str | None) -> None:
        if per_node and node and node not in (entry.get("nodes") or []):
            entry["nodes"] = sorted([*(entry.get("nodes") or []), node])

    failures = [f for f in before.get("captureFailures") or [] if f.get("pod") in live_pods]
    for name, capture in sorted(logs.reports.items()):
        pod = live_pods.get(name)
        if pod is None or not capture.key:
            continue
        node = (pod.get("spec") or {}).get("nodeName")
        if capture.failed:
            if not any(f.get("pod") == name for f in failures):
                reason = capture.reason or "no reason given"
                failures.append({"pod": name, "key": capture.key, "outcome": capture.event, "reason": reason})
                message = f"pod {name} did not store compile cache {capture.key[:12]} ({capture.event}): {reason}"
                events.append(("Warning", CAPTURE_FAILED_EVENT, message))
            continue
        where = f" on node {node}" if node else ""
        how = f"captured from pod {name}{where}"
        if capture.event == "present":  # stored by another engine first: its generation comes with a restore
            how = f"pod {name}{where} found it stored"
        entry = entry_for(capture.key, capture.summary, capture.bytes, how)
        record(entry, capture.summary, capture.generation, capture.files, capture.bytes)
        held_on(entry, node)
    for engine in reports:
        report = engine.report
        if report.event != "restored" or not report.key:
            continue
        entry = entry_for(report.key, report.summary, report.bytes, f"pod {engine.pod} started from it")
        record(entry, report.summary, report.generation, report.files, report.bytes)
        held_on(entry, engine.node)
    newest = sorted(caches.values(), key=lambda c: (c.get("captured") or "", c["key"]), reverse=True)[:MAX_ENTRIES]
    hits = sum(1 for r in reports if r.report.event == "restored")
    misses = [r for r in reports if r.report.event == "miss"]
    status: dict[str, Any] = {
        "store": store,
        "hits": hits,
        "misses": len(misses),
        "caches": [{k: v for k, v in c.items() if v is not None} for c in newest],
        "summary": f"{_count(len(newest), 'key')}, {_count(hits, 'hit')}, {_count(len(misses), 'miss', 'misses')}",
    }
    if failures:
        status["captureFailures"] = failures[-MAX_ENTRIES:]
    status["capturing"] = len(awaited_captures(status, reports))
    if forbidden := logs_forbidden(before, logs, awaiting=status["capturing"] > 0):
        status["captureLogsForbidden"] = forbidden
        if not before.get("captureLogsForbidden"):
            events.append(("Warning", LOGS_FORBIDDEN_EVENT, forbidden))
    if misses:
        status["lastMiss"] = f"pod {misses[-1].pod}: {misses[-1].report.reason or 'no reason given'}"
    return status, events


def logs_forbidden(before: Mapping[str, Any], logs: CaptureLogs, *, awaiting: bool) -> str | None:
    """status.compileCache.captureLogsForbidden: set by a read the API server refused; kept while captures are
    awaited and no log was asked for this round (nothing says the grant came); gone once a read is allowed (any
    other answer, a 404 or a 400 included, is the kubelet's or the pod's) or nothing is awaited any more."""
    if logs.forbidden is not None:
        return (
            f"the API server refuses the operator the capture sidecars' logs ({logs.forbidden}): grant it get on"
            " pods/log in this namespace (the chart's RBAC does, docs/security.md); until then captures stay"
            f" awaited and their logs are tried at each resync, not every {CAPTURE_POLL_SECONDS:.0f} s"
        )
    if logs.asked or not awaiting:
        return None
    return before.get("captureLogsForbidden")


def capture_poll_seconds(compile_cache: Mapping[str, Any]) -> float | None:
    """How soon to read the sidecars' logs again, from status.compileCache: every `CAPTURE_POLL_SECONDS` while a
    capture is awaited, not sooner than the resync (None) while the API server refuses them: a refusal is mended
    by a person, not by asking again."""
    if compile_cache.get("capturing") and not compile_cache.get("captureLogsForbidden"):
        return CAPTURE_POLL_SECONDS
    return None
