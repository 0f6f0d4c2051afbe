"""Does offloading pay? status.offload and the OffloadEffective condition, from the servers' counters (the
models this fills, the same concept one layer up, are `api/offload.py`).

Pure: `sample` sums one scrape's counters, `advance` keeps the window's two starts (so the verdict is over
deltas, not since the servers started), `judge` applies the break-even rule to a delta. The rule: offloading pays
when the recompute time the hits saved exceeds the time loading them took plus the miss overhead (the time spent
on lookups that found nothing and on stores, which offloading costs whether or not anything is reused):

    hits * chunkTokens * recompute per token  >  load seconds + miss overhead seconds

equivalently, when the hit ratio exceeds (miss overhead per lookup) / (recompute - load per hit): the break-even
hit ratio reported beside it (with DESIGN.md's 576 ms recompute vs 48.6 ms load it is a few percent).
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Mapping, Sequence
from typing import Any

from strata_units import format_bytes

from strata_operator.api.kvcachetier import KVCacheTierSpec
from strata_operator.api.offload import RecomputeSource, Verdict
from strata_operator.resources.kvcachetier.engines import engine_sample, measured_us_per_token, refusals
from strata_operator.resources.kvcachetier.usage import TIERS, ServerUsage

GHOST_FACTORS = ("1.25", "1.5", "2", "3", "4")
"""The servers' `l1_size_factor` labels (strata_kv.store.offload_stats.GHOST_FACTORS)."""
SUGGEST_MIN_LIFT = 0.01
"""A larger L1 is suggested only when it would have answered at least this share of the window's lookups..."""
SUGGEST_SHARE_OF_BEST = 0.8
"""...and then the smallest size that gets this share of what the largest one would have."""

_SAMPLES: dict[str, str] = {
    **{f"hits_{t}": f'strata_kv_hits_total{{tier="{t}"}}' for t in TIERS},
    "misses": "strata_kv_misses_total",
    "stores": "strata_kv_sets_total",
    "stored_bytes": "strata_kv_offload_stored_bytes_total",
    **{f"loaded_bytes_{t}": f'strata_kv_offload_loaded_bytes_total{{tier="{t}"}}' for t in TIERS},
    "first_reads": "strata_kv_offload_first_reads_total",
    "evicted_unread": "strata_kv_offload_evicted_unread_total",
    **{f"ghost_{f}": f'strata_kv_offload_ghost_hits_total{{l1_size_factor="{f}"}}' for f in GHOST_FACTORS},
}
"""Counter → the sample it sums (counts and bytes)."""
_SECONDS: dict[str, str] = {
    **{f"load_us_{t}": f'strata_kv_offload_load_seconds_total{{tier="{t}"}}' for t in TIERS},
    "miss_us": "strata_kv_offload_miss_seconds_total",
    "store_us": "strata_kv_offload_store_seconds_total",
}
"""Counter → the seconds sample it sums, kept as whole microseconds (status holds no floats)."""
METRIC_NAMES = tuple(sorted({s.split("{")[0] for s in (*_SAMPLES.values(), *_SECONDS.values())}))
"""Every server metric the verdict reads (the dashboard test checks the same names against a real server)."""


def sample(
    servers: Sequence[tuple[str, ServerUsage | None]],
    at: str,
    engines: Sequence[tuple[str, Mapping[str, float] | None]] | None = None,
) -> dict[str, Any]:
    """One scrape's counters summed over the servers that answered, and which servers those were; with `engines`
    (the wired engines' prefill sums, `engines.parse_engine_metrics`), theirs too."""
    answered = [(identity, usage) for identity, usage in servers if usage is not None]
    counters = {name: sum(int(u.samples.get(key, 0)) for _, u in answered) for name, key in _SAMPLES.items()}
    for name, key in _SECONDS.items():
        counters[name] = sum(round(u.samples.get(key, 0.0) * 1e6) for _, u in answered)
    taken: dict[str, Any] = {
        "at": at,
        "servers": ",".join(sorted(identity for identity, _ in answered)),
        "counters": counters,
    }
    if engines:
        taken.update(engine_sample(engines))
    return taken


def _seconds_between(start: str, end: str) -> float:
    parse = datetime.datetime.fromisoformat
    return (parse(end.replace("Z", "+00:00")) - parse(start.replace("Z", "+00:00"))).total_seconds()


def _comparable(start: Mapping[str, Any] | None, latest: Mapping[str, Any]) -> bool:
    """Counters of `latest` can be subtracted from `start`'s: the same servers, none restarted, none went back, and
    `start` not taken later than `latest` (another operator replica's clock ahead of this one's)."""
    if start is None or start.get("servers") != latest["servers"]:
        return False
    if _seconds_between(start["at"], latest["at"]) < 0:
        return False
    before = start.get("counters") or {}
    return all(latest["counters"].get(k, 0) >= v for k, v in before.items())


def advance(window: Mapping[str, Any] | None, latest: dict[str, Any], window_seconds: int) -> dict[str, Any]:
    """The window's starts after a scrape: `current` turns `previous` once it is window_seconds old; a restarted,
    added or lost server (counters not comparable) starts the window again at `latest`."""
    window = window or {}
    current, previous = window.get("current"), window.get("previous")
    if not _comparable(current, latest):
        return {"current": latest}
    assert current is not None
    if not _comparable(previous, latest):
        previous = None
    if _seconds_between(current["at"], latest["at"]) >= window_seconds:
        return {"current": latest, "previous": current}
    return {"current": current, "previous": previous} if previous else {"current": current}


def _delta(start: Mapping[str, Any], latest: Mapping[str, Any]) -> dict[str, int]:
    before = start.get("counters") or {}
    return {k: v - int(before.get(k, 0)) for k, v in latest["counters"].items()}


def _ratio(part: float, whole: float) -> str:
    return f"{part / whole:.3f}" if whole else "0.000"


def _secs(microseconds: float) -> str:
    return f"{microseconds / 1e6:.6f}"


def judge(
    delta: Mapping[str, int], seconds: float, spec: KVCacheTierSpec, measured_us_per_token: int | None = None
) -> tuple[dict[str, Any], str]:
    """The verdict on one window's counter deltas: status.offload's numbers and the condition's message.
    `measured_us_per_token`: the engines' prefill time per token over the window, where known (else the setting)."""
    settings = spec.offload_verdict
    per_token = measured_us_per_token or settings.recompute_microseconds_per_token
    source = RecomputeSource.ENGINE_METRICS if measured_us_per_token else RecomputeSource.SETTING
    hits = sum(delta.get(f"hits_{t}", 0) for t in TIERS)
    lookups = hits + delta.get("misses", 0)
    stores = delta.get("stores", 0)
    load_us = sum(delta.get(f"load_us_{t}", 0) for t in TIERS)
    overhead_us = delta.get("miss_us", 0) + delta.get("store_us", 0)
    overhead_us += lookups * settings.engine_overhead_microseconds_per_lookup
    recompute_per_hit_us = spec.chunk_tokens * per_token
    saved_us = hits * recompute_per_hit_us
    status: dict[str, Any] = {
        "windowSeconds": int(seconds),
        "lookups": lookups,
        "hits": hits,
        "hitRatio": _ratio(hits, lookups),
        "storedBytes": delta.get("stored_bytes", 0),
        "loadedBytes": sum(delta.get(f"loaded_bytes_{t}", 0) for t in TIERS),
        "storedChunks": stores,
        "unreadShare": _ratio(max(stores - delta.get("first_reads", 0), 0), stores),
        "evictedUnread": delta.get("evicted_unread", 0),
        "loadSeconds": _secs(load_us),
        "missOverheadSeconds": _secs(overhead_us),
        "recomputeSavedSeconds": _secs(saved_us),
        "recomputeSource": source.value,
        "recomputeMicrosecondsPerToken": per_token,
        "tiers": [
            {
                "tier": t,
                "hits": delta.get(f"hits_{t}", 0),
                "hitRatio": _ratio(delta.get(f"hits_{t}", 0), lookups),
                "loadedBytes": delta.get(f"loaded_bytes_{t}", 0),
                "loadSeconds": _secs(delta.get(f"load_us_{t}", 0)),
            }
            for t in TIERS
            if delta.get(f"hits_{t}", 0) or delta.get(f"loaded_bytes_{t}", 0)
        ],
    }
    load_per_hit_us = load_us / hits if hits else 0.0
    if lookups and recompute_per_hit_us > load_per_hit_us:
        status["breakEvenHitRatio"] = f"{min(overhead_us / lookups / (recompute_per_hit_us - load_per_hit_us), 1):.4f}"
    status.update(suggest_l1(delta, lookups, hits, int(spec.l1.size)))
    if lookups < settings.min_lookups:
        status["verdict"] = Verdict.INSUFFICIENT_DATA.value
        return status, f"{lookups} lookups in {int(seconds)} s; the verdict needs {settings.min_lookups}"
    pays = saved_us > load_us + overhead_us
    status["verdict"] = (Verdict.PAYS if pays else Verdict.DOES_NOT_PAY).value
    relation = "exceeds" if pays else "does not exceed"
    message = (
        f"hit ratio {status['hitRatio']} over {int(seconds)} s: recompute saved {saved_us / 1e6:.3f} s {relation} "
        f"load {load_us / 1e6:.3f} s + miss overhead {overhead_us / 1e6:.3f} s"
    )
    if not pays and status["unreadShare"] != "0.000":
        message += f"; {status['unreadShare']} of the chunks stored were never read"
    return status, message


def suggest_l1(delta: Mapping[str, int], lookups: int, hits: int, l1_size: int) -> dict[str, str | int]:
    """A larger l1.size where the policy's ghosts say it would have lifted the hit ratio notably; else nothing.

    The size goes out twice, made once here: a quantity for the person who pastes it into l1.size, and the byte
    count the metrics read (so nothing parses the quantity back)."""
    lifts = [(float(f), delta.get(f"ghost_{f}", 0)) for f in GHOST_FACTORS]
    best = max((extra for _, extra in lifts), default=0)
    if not lookups or best < SUGGEST_MIN_LIFT * lookups:
        return {}
    factor, extra = next((f, e) for f, e in lifts if e >= SUGGEST_SHARE_OF_BEST * best)
    mib = 1024**2
    size = math.ceil(factor * l1_size / mib) * mib
    return {
        "suggestedL1Size": format_bytes(size, quantity=True),
        "suggestedL1Bytes": size,
        "suggestedHitRatio": _ratio(hits + extra, lookups),
    }


def offload_status(
    spec: KVCacheTierSpec, previous: Mapping[str, Any] | None, latest: dict[str, Any]
) -> tuple[dict[str, Any], str]:
    """status.offload after a scrape (`latest` from `sample`), and the condition's message."""
    window = advance((previous or {}).get("window"), latest, spec.offload_verdict.window_seconds)
    start = window.get("previous") or window["current"]
    seconds = _seconds_between(start["at"], latest["at"])
    status, message = judge(_delta(start, latest), seconds, spec, measured_us_per_token(start, latest))
    refused = refusals(start, latest)
    if refused is not None:
        status["engineStoreRefusals"] = refused["engine_store_refusals"]
        status["engineLoadRefusals"] = refused["engine_load_refusals"]
        if any(refused.values()):
            message += (
                f"; the engines' CPU tiers had no room for {refused['engine_store_refusals']} stores and "
                f"{refused['engine_load_refusals']} loads (their chunks were recomputed): raise connector.cpuBytes "
                f"({format_bytes(int(spec.connector.cpu_bytes), quantity=True)} per engine)"
            )
    if start is latest:
        message = "the window starts now (first scrape, or a server restarted, joined or did not answer)"
    status["window"] = window
    return status, message


CONDITION_STATUS = {Verdict.PAYS.value: "True", Verdict.DOES_NOT_PAY.value: "False"}
"""OffloadEffective's status per verdict; InsufficientData is Unknown."""
