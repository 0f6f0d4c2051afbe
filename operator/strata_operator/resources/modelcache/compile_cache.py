"""status.compileCache: what the engines' restore init containers reported, as a pure function of the consumer pods.

The operator reads the compile cache the way it reads a preload: from a container's termination message. Each
wired engine's `strata-compile-restore` init container ends with a `contract.CompileRestoreReport` (restored, with
the key, generation and size; or a miss with its reason). Counted over the live consumer pods these are the hits
and misses; a key restored for the first time is a key the store holds, recorded in `caches` (kept when its pods
go) with an Event `CompileCacheCaptured`. The capture sidecar itself runs until its pod stops, so a capture is
seen once the next engine of that key restores it.
"""

from __future__ import annotations

import datetime
import posixpath
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strata_loader.contract import CompileRestoreReport
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
MAX_ENTRIES = 16
CAPTURED_EVENT = "CompileCacheCaptured"
TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


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


def engine_reports(pods: Sequence[Mapping[str, Any]]) -> list[EngineReport]:
    """The reports of the live pods (ended pods are no longer engines), oldest pod first."""
    found = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in capacity.ENDED_POD_PHASES:
            continue
        meta = pod.get("metadata") or {}
        if meta.get("deletionTimestamp") or (report := restore_report(pod)) is None:
            continue
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
    previous: Mapping[str, Any], pods: Sequence[Mapping[str, Any]], *, store: str, per_node: bool
) -> tuple[dict[str, Any], list[Event]]:
    """status.compileCache from the stored one and the consumer pods, and an Event for each key seen first now.
    `per_node`: NodeLocal, where every node has a store of its own (an entry lists the nodes it was restored on)."""
    reports = engine_reports(pods)
    stored = (previous.get("compileCache") or {}).get("caches") or []
    caches: dict[str, dict[str, Any]] = {c["key"]: dict(c) for c in stored if c.get("key")}
    events: list[Event] = []
    for engine in reports:
        report = engine.report
        if report.event != "restored" or not report.key:
            continue
        entry = caches.get(report.key)
        if entry is None:
            entry = caches[report.key] = {"key": report.key}
            size = format_bytes(report.bytes or 0, approximate=True)
            events.append(
                (
                    "Normal",
                    CAPTURED_EVENT,
                    f"compile cache {report.key[:12]} ({report.summary or 'no summary'}, {size}) is stored: pod "
                    f"{engine.pod} started from it",
                )
            )
        if report.generation and report.generation >= str(entry.get("generation") or ""):
            entry.update(
                summary=report.summary or entry.get("summary"),
                generation=report.generation,
                captured=captured_at(report.generation),
                bytes=report.bytes,
                size=format_bytes(report.bytes or 0, approximate=True),
                files=report.files,
            )
        if per_node and engine.node and engine.node not in (entry.get("nodes") or []):
            entry["nodes"] = sorted([*(entry.get("nodes") or []), engine.node])
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
    if misses:
        status["lastMiss"] = f"pod {misses[-1].pod}: {misses[-1].report.reason or 'no reason given'}"
    return status, events
