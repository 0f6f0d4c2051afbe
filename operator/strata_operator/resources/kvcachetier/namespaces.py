"""The model <-> KV link: KV namespaces that carry the model revision, and the collection of old revisions' ones.

Persisted KV outlives the weights it was computed with. vLLM's offloading tiers and LMCache both key KV by the
engine's model name, which is the `--model` path as given (vLLM's `FileMapper`: `model_name=config.model.name`,
from `model_config.model`; LMCache: `LMCacheEngineMetadata(model_config.model, ...)`), and vLLM's digest next to it
covers the KV layout (block size, parallel sizes, KV dtype, KV groups) but not the weights' revision nor RoPE or
quantization settings. So the webhook mounts a ModelCache at `<mountPath>/rev-<revision12>` (with
`-kv-<digest8>` added when the pod's args change KV bytes beyond vLLM's digest) and the engine, given
`--model $(STRATA_MODEL_DIR)`, names its KV after the revision: two revisions can never hit each other's blocks.

The webhook records the revision and that model name on the pod (annotations); the tier lists its wired pods,
remembers each (cache, revision, model) in status.namespaces, and once a revision is no longer the cache's and no
pod has served it for `namespaceCollection.gracePeriodSeconds`, drops its namespaces from every server. Everything
here is pure: the tier's gather reads the wired pods and the caches' revisions, its plan (`resources/kvcachetier/
plan.py`) turns each due record into a `Drop`, its execute sends them (`STRATA.NAMESPACES`, then `STRATA.DROPNS`
per namespace, through `strata_kv.client`), and its settle folds the answers into status (`settle_collection`).
This is the operator's side of KV namespaces; the server's own bookkeeping of them is `strata_kv`'s.
"""

from __future__ import annotations

import datetime
import hashlib
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from strata_operator.api import GROUP
from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.resources.core import Event

REVISION_ANNOTATION = f"{GROUP}/model-revision"
"""On a wired pod: the 12 hex digits of the ModelCache revision its model name carries."""
KV_MODEL_ANNOTATION = f"{GROUP}/kv-model"
"""On a wired pod: the model path the engine was given, i.e. what its KV namespaces are named after."""
MODEL_CACHE_ANNOTATION = f"{GROUP}/kv-model-cache"
"""On a wired pod: the ModelCache that revision is of (the label may be edited; this records the wiring)."""
REVISION_ENV = "STRATA_MODEL_REVISION"
REVISION_DIGITS = 12
LAYOUT_FLAGS = ("--hf-overrides", "--quantization", "-q", "--hf-config-path")
"""vLLM flags that change KV bytes but not vLLM's namespace digest: RoPE settings live in `--hf-overrides` in vLLM
0.33 (`rope_scaling`, `rope_theta`), quantization changes the activations KV is computed from."""
COLLECTED_KEPT = 10
"""status.collectedNamespaces keeps the latest this many."""
NAMESPACE_COLLECTED = "NamespaceCollected"

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_DIGEST = re.compile(r"^sha256:(?P<hex>[0-9a-f]{64})$")
_SHA256 = re.compile(r"^([0-9a-f]{64})$")


def cache_revision(cache: Mapping[str, Any]) -> str | None:
    """The cache's resolved revision as 12 hex digits, or None while it has none.

    In order: the commit an hf:// source resolved to, an image digest (`sha256:<hex>`, for oci://), the SHA-256 of
    the copy's manifest (s3://, pvc://: it names the exact bytes copied). The one place that decides what a
    revision is; a new kind of source extends it here.
    """
    status = cache.get("status") or {}
    image = status.get("image") or {}  # ImageVolume: the digest the oci:// tag was pinned to
    for value in (status.get("resolvedRevision"), status.get("resolvedDigest"), image.get("digest")):
        if isinstance(value, str):
            if _COMMIT.match(value):
                return value[:REVISION_DIGITS]
            if match := _DIGEST.match(value):
                return match.group("hex")[:REVISION_DIGITS]
    manifest = status.get("manifestSha256")  # `sha256:<hex>` as the loader writes it
    if isinstance(manifest, str) and (match := _DIGEST.match(manifest) or _SHA256.match(manifest)):
        return match.group(match.lastindex or 0)[:REVISION_DIGITS]
    return None


def request_revision(cache: Mapping[str, Any]) -> str | None:
    """`req-<12 hex>` over the cache's uid and what it asks to copy (uri, revision, include, exclude); None without
    a source. The namespace of pods wired before the cache resolved its revision: one ModelCache copies one revision
    per request (a NodeLocal cache pins the commit its first copy resolved), so it names the weights too."""
    source = (cache.get("spec") or {}).get("source") or {}
    if not source.get("uri"):
        return None
    uid = (cache.get("metadata") or {}).get("uid") or ""
    fields = [uid, source.get("uri"), source.get("revision") or "", source.get("include"), source.get("exclude")]
    return "req-" + hashlib.sha256(json.dumps(fields).encode()).hexdigest()[:REVISION_DIGITS]


def current_revisions(cache: Mapping[str, Any] | None) -> frozenset[str]:
    """The revisions new pods of a cache are wired with now: namespaces of these are kept. Its resolved revision
    once it has one (a request's `req-` namespace is then no longer given out, and goes once its pods do); before,
    a pinned commit and its request's."""
    if cache is None:
        return frozenset()
    resolved = cache_revision(cache)
    if resolved is not None:
        return frozenset([resolved])
    return frozenset(r for r in (wiring_revision(cache), request_revision(cache)) if r is not None)


def wiring_revision(cache: Mapping[str, Any]) -> str | None:
    """The revision a pod wired now gets: the resolved one, a commit the spec pins (known before the copy), or
    before either, the request's (`request_revision`)."""
    resolved = cache_revision(cache)
    if resolved is not None:
        return resolved
    asked = ((cache.get("spec") or {}).get("source") or {}).get("revision")
    if isinstance(asked, str) and _COMMIT.match(asked):
        return asked[:REVISION_DIGITS]
    return request_revision(cache)


def layout_digest(containers: Sequence[Mapping[str, Any]]) -> str | None:
    """8 hex digits over the `LAYOUT_FLAGS` the containers pass (as written), or None when they pass none."""
    found: list[list[str]] = []
    for container in containers:
        words = [str(w) for w in (container.get("command") or []) + (container.get("args") or [])]
        for i, word in enumerate(words):
            for flag in LAYOUT_FLAGS:
                if word == flag:
                    found.append([flag, words[i + 1] if i + 1 < len(words) else ""])
                elif word.startswith(f"{flag}="):
                    found.append([flag, word[len(flag) + 1 :]])
    if not found:
        return None
    return hashlib.sha256(json.dumps(sorted(found)).encode()).hexdigest()[:8]


def engine_model_path(mount_path: str, revision: str, layout: str | None) -> str:
    """Where the model is mounted, and so the name the engine's KV is keyed by."""
    leaf = (revision if revision.startswith("req-") else f"rev-{revision}") + (f"-kv-{layout}" if layout else "")
    return f"{mount_path.rstrip('/')}/{leaf}"


def belongs(namespace: str, model: str) -> bool:
    """Is `namespace` (`<model with / as _>_<digest12>`, as the server lists it) one of `model`'s?"""
    safe = re.escape(model.replace("/", "_"))
    return re.fullmatch(safe + r"_[0-9a-f]{12}", namespace) is not None


# -- collection --------------------------------------------------------------------------------------------
@dataclass(frozen=True, order=True)
class Served:
    """What one wired pod's annotations say it serves."""

    model_cache: str
    revision: str
    model: str


def served_by(pod: Mapping[str, Any]) -> Served | None:
    """The (cache, revision, model) a pod serves; None for a pod not wired with a revision or one that ended."""
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    phase = (pod.get("status") or {}).get("phase")
    cache, revision, model = (
        annotations.get(k) for k in (MODEL_CACHE_ANNOTATION, REVISION_ANNOTATION, KV_MODEL_ANNOTATION)
    )
    if not (cache and revision and model) or phase in ("Succeeded", "Failed"):
        return None
    return Served(cache, revision, model)


@dataclass
class NamespaceObservation:
    """What the namespace step read: wired pods, the caches' current revisions, and the time."""

    pods: Sequence[Mapping[str, Any]] = ()
    current: Mapping[str, frozenset[str]] = field(default_factory=dict)
    """ModelCache name -> the revisions it serves now (`current_revisions`; empty when deleted)."""
    now: str = ""


@dataclass
class Collection:
    """Records to keep in status.namespaces, and those due for collection now."""

    records: list[dict[str, Any]]
    due: list[dict[str, Any]]


def _parse(when: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(when.replace("Z", "+00:00"))


def track(previous: Iterable[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]], now: str) -> list[dict[str, Any]]:
    """status.namespaces: every (cache, revision, model) a pod serves now or that was recorded before, with its
    pod count; `idleSince` starts when the count drops to zero and clears when a pod serves it again."""
    counts = Counter(s for pod in pods if (s := served_by(pod)) is not None)
    records: dict[Served, dict[str, Any]] = {}
    for old in previous:
        key = Served(old["modelCache"], old["revision"], old["model"])
        records[key] = dict(old)
    for key in counts:
        records.setdefault(key, {"modelCache": key.model_cache, "revision": key.revision, "model": key.model})
    result = []
    for key in sorted(records):
        record = records[key]
        record["servingPods"] = counts.get(key, 0)
        if record["servingPods"]:
            record.pop("idleSince", None)
            record.pop("pending", None)
        else:
            record.setdefault("idleSince", now)
        result.append(record)
    return result


def plan_collection(spec: KVCacheTierSpec, previous: Mapping[str, Any], seen: NamespaceObservation) -> Collection:
    """Which records are due: no pod serves them, the cache has moved to another revision (or is gone), and the
    grace period has passed since their last pod went. A cache's current revision is never due."""
    records = track(previous.get("namespaces") or [], seen.pods, seen.now)
    gc = spec.namespace_collection
    if not gc.enabled:
        return Collection(records, [])
    now = _parse(seen.now)
    due = [
        r
        for r in records
        if not r["servingPods"]
        and r["revision"] not in seen.current.get(r["modelCache"], frozenset())
        and (now - _parse(r["idleSince"])).total_seconds() >= gc.grace_period_seconds
    ]
    return Collection(records, due)


@dataclass(frozen=True)
class Drop:
    """A plan's action: drop every KV namespace of `model` from each server (the due record `key`)."""

    key: tuple[str, str, str]
    """The record's (modelCache, revision, model)."""
    model: str
    servers: tuple[tuple[str, str | None], ...]
    """(pod name, host; None when it cannot be asked now) of every server; ("(no server)", None) when there is none:
    a shared L2 keeps the namespaces until a server can drop them."""
    port: int
    token: tuple[str, str] | None = None
    """The Secret and key holding the servers' token; None when the tier's auth is disabled."""


def record_key(record: Mapping[str, Any]) -> tuple[str, str, str]:
    return (record["modelCache"], record["revision"], record["model"])


def servers_of(pods: Sequence[Mapping[str, Any]]) -> tuple[tuple[str, str | None], ...]:
    """(pod name, host or None when not ready) of every server pod that is not terminating."""
    servers = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
        servers.append((str(meta.get("name")), status.get("podIP") if ready else None))
    return tuple(servers) or (("(no server)", None),)


def drops(
    collection: Collection, server_pods: Sequence[Mapping[str, Any]], port: int, token: tuple[str, str] | None
) -> list[Drop]:
    """One `Drop` per record due."""
    servers = servers_of(server_pods)
    return [Drop(record_key(r), r["model"], servers, port, token) for r in collection.due]


@dataclass(frozen=True)
class ServerDrops:
    """What one server answered for one record: namespace -> (blocks, bytes freed); or why it could not."""

    server: str
    freed: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    error: str | None = None


def settle_collection(
    collection: Collection,
    results: Mapping[tuple[str, str, str], Sequence[ServerDrops]],
    previous: Mapping[str, Any],
    now: str,
) -> tuple[dict[str, Any], list[Event]]:
    """status.namespaces and status.collectedNamespaces after the drops, and one Event per namespace freed.

    A record whose every server answered is done (dropped from status.namespaces); one with a server that did
    not stays, saying which, and is tried again at the next reconcile (dropping is idempotent)."""
    collected = list(previous.get("collectedNamespaces") or [])
    events: list[Event] = []
    records = []
    for record in collection.records:
        answers = results.get(record_key(record))
        if answers is None:
            records.append(record)
            continue
        totals: dict[str, list[int]] = {}
        for answer in answers:
            for namespace, (blocks, freed) in answer.freed.items():
                total = totals.setdefault(namespace, [0, 0])
                total[0] += blocks
                total[1] += freed
        for namespace, (blocks, freed) in sorted(totals.items()):
            if not blocks and not freed:
                continue
            collected.append(
                {
                    "namespace": namespace,
                    "modelCache": record["modelCache"],
                    "revision": record["revision"],
                    "blocks": blocks,
                    "freedBytes": freed,
                    "time": now,
                }
            )
            events.append(
                (
                    "Normal",
                    NAMESPACE_COLLECTED,
                    f"freed {freed} bytes ({blocks} blocks) of {namespace} (ModelCache {record['modelCache']} "
                    f"revision {record['revision']}, no longer served)",
                )
            )
        failed = [f"{a.server}: {a.error}" for a in answers if a.error]
        if failed:
            records.append(
                replace_pending(record, f"not collected from {len(failed)} server(s), retried: " + "; ".join(failed))
            )
    fields = {"namespaces": records, "collectedNamespaces": extend_collected(collected, [])}
    return {k: v for k, v in fields.items() if v}, events  # an empty list is left out (a tier without wired pods)


def added_collected(previous: Mapping[str, Any], patch: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The entries of status.collectedNamespaces a status patch adds to the log as it was read.

    Counted, not looked up: two servers that free the same bytes of one namespace in the same second make two
    equal entries, and the second is an addition too."""
    left = Counter(json.dumps(entry, sort_keys=True) for entry in previous.get("collectedNamespaces") or [])
    added = []
    for entry in patch.get("collectedNamespaces") or []:
        text = json.dumps(entry, sort_keys=True)
        if left[text]:
            left[text] -= 1
        else:
            added.append(dict(entry))
    return added


def extend_collected(log: Iterable[Mapping[str, Any]], added: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """status.collectedNamespaces: the log, then what was added, keeping the last `COLLECTED_KEPT`."""
    return [dict(entry) for entry in [*log, *added]][-COLLECTED_KEPT:]


def replace_pending(record: Mapping[str, Any], why: str) -> dict[str, Any]:
    return {**record, "pending": why[:1000]}
