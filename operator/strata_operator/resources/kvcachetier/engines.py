"""The wired engines' measured prefill time per token, from vLLM's own /metrics: what a hit saves when the
engines say so (status.offload.recomputeSource EngineMetrics), instead of spec.offloadVerdict's setting; and the
transfers their CPU tiers refused for want of room (a chunk never offloaded, or never loaded back: recomputed).

vLLM (0.32, 0.33) exports `vllm:request_prefill_time_seconds` (a histogram of each request's prefill time) and
`vllm:request_prefill_kv_computed_tokens` (of the tokens each prefill computed, cached ones excluded): the ratio of
their sums' deltas is the seconds one computed token costs. Pure; the scraping is the tier's gather.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

ENGINE_SAMPLES = {
    "prefill_seconds": "vllm:request_prefill_time_seconds_sum",
    "prefill_tokens": "vllm:request_prefill_kv_computed_tokens_sum",
    "store_refusals": "vllm:kv_offload_allocation_failure_total",
    "load_refusals": "vllm:kv_offload_tiering_promotion_allocation_failures_total",
}
"""Sum → the vLLM sample it adds up over every label set (model, engine index, tier). The refusals are vLLM's
offloading connector's: a store it could not place in the CPU tier (the request's new chunks are not offloaded),
a load from the secondary tier the CPU tier had no room for (the chunks are recomputed)."""
REFUSALS = {"store_refusals": "engine_store_refusals", "load_refusals": "engine_load_refusals"}
"""Sum → its name in the window sample's engine counters."""
MIN_ENGINE_TOKENS = 1000
"""Fewer computed tokens in the window than this: the engines' figure is too noisy; the setting is used."""
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def parse_engine_metrics(text: str) -> dict[str, float]:
    """The prefill sums of one engine's /metrics (0 for a sample it does not export)."""
    wanted = {sample: counter for counter, sample in ENGINE_SAMPLES.items()}
    sums = dict.fromkeys(ENGINE_SAMPLES, 0.0)
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is not None and match.group("name") in wanted:
            sums[wanted[match.group("name")]] += float(match.group("value"))
    return sums


def engine_sample(engines: Sequence[tuple[str, Mapping[str, float] | None]]) -> dict[str, object]:
    """The engines that answered (pod/restarts) and their sums, seconds as whole microseconds."""
    answered = [(who, sums) for who, sums in engines if sums is not None]
    return {
        "engines": ",".join(sorted(who for who, _ in answered)),
        "engineCounters": {
            "engine_prefill_us": round(sum(s.get("prefill_seconds", 0.0) for _, s in answered) * 1e6),
            "engine_prefill_tokens": round(sum(s.get("prefill_tokens", 0.0) for _, s in answered)),
            **{name: round(sum(s.get(key, 0.0) for _, s in answered)) for key, name in REFUSALS.items()},
        },
    }


def _counter_pair(
    start: Mapping[str, object], latest: Mapping[str, object]
) -> tuple[Mapping[str, Any], Mapping[str, Any]] | None:
    """The engine counters of two samples, when the same engines answered both (engines came, went or restarted:
    their counters do not subtract)."""
    if not latest.get("engines") or start.get("engines") != latest.get("engines"):
        return None
    before, after = start.get("engineCounters") or {}, latest.get("engineCounters") or {}
    assert isinstance(before, Mapping) and isinstance(after, Mapping)
    return before, after


def refusals(start: Mapping[str, object], latest: Mapping[str, object]) -> dict[str, int] | None:
    """The transfers the engines' CPU tiers refused between two samples, by kind; None unless the same engines
    answered both and both samples counted them (one taken by an operator that did not is not comparable)."""
    pair = _counter_pair(start, latest)
    if pair is None or not all(name in side for side in pair for name in REFUSALS.values()):
        return None
    before, after = pair
    return {name: max(int(after[name]) - int(before[name]), 0) for name in REFUSALS.values()}


def measured_us_per_token(start: Mapping[str, object], latest: Mapping[str, object]) -> int | None:
    """Prefill microseconds per computed token between two samples; None when the same engines did not compute
    MIN_ENGINE_TOKENS in between (engines came, went or restarted, or too little traffic)."""
    pair = _counter_pair(start, latest)
    if pair is None:
        return None
    before, after = pair
    tokens = int(after.get("engine_prefill_tokens", 0)) - int(before.get("engine_prefill_tokens", 0))
    seconds_us = int(after.get("engine_prefill_us", 0)) - int(before.get("engine_prefill_us", 0))
    if tokens < MIN_ENGINE_TOKENS or seconds_us <= 0:
        return None
    return max(1, round(seconds_us / tokens))
