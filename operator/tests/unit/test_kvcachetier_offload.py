"""The offload verdict on plain data: the break-even rule (Pays, DoesNotPay, InsufficientData and the boundary),
the window over deltas (restarts, lost servers, rotation), the suggested L1 size, and the status it ends in."""

from __future__ import annotations

from typing import Any

import pytest
from strata_operator.api.kvcachetier import KVCacheTierSpec, KVCacheTierStatus
from strata_operator.resources.kvcachetier.engines import parse_engine_metrics
from strata_operator.resources.kvcachetier.names import TierRef
from strata_operator.resources.kvcachetier.observed import Observed
from strata_operator.resources.kvcachetier.offload import advance, judge, offload_status, sample, suggest_l1
from strata_operator.resources.kvcachetier.plan import plan
from strata_operator.resources.kvcachetier.usage import ServerUsage, parse_metrics
from strata_operator.resources.runtime_image import RuntimeImage

TIER = TierRef(name="kv", namespace="serving", uid="tier-uid", generation=3)
RUNTIME = RuntimeImage("registry.local/strata-runtime:test")
# chunkTokens 100 at 10 us per token: every hit saves 1,000 us of prefill.
SPEC = KVCacheTierSpec.model_validate(
    {"chunkTokens": 100, "offloadVerdict": {"recomputeMicrosecondsPerToken": 10, "minLookups": 100}}
)


def counts(hits: int, misses: int, *, load_us: int = 0, miss_us: int = 0, store_us: int = 0, **more: int) -> dict:
    return {"hits_l1": hits, "misses": misses, "load_us_l1": load_us, "miss_us": miss_us, "store_us": store_us, **more}


def test_hits_that_save_more_prefill_than_they_cost_pay() -> None:
    status, message = judge(counts(50, 950, load_us=5_000, miss_us=9_500, store_us=9_500, stores=950), 600, SPEC)
    assert status["verdict"] == "Pays" and status["hitRatio"] == "0.050"
    assert status["recomputeSavedSeconds"] == "0.050000" and status["missOverheadSeconds"] == "0.019000"
    assert "exceeds" in message and status["recomputeSource"] == "Setting"
    # overhead per lookup 19 us / (1,000 - 100 us saved net per hit) = 0.0211
    assert status["breakEvenHitRatio"] == "0.0211"


def test_traffic_that_is_never_reused_does_not_pay_and_says_what_was_never_read() -> None:
    delta = counts(0, 1000, miss_us=10_000, store_us=20_000, stores=1000, stored_bytes=10**6, first_reads=0)
    status, message = judge(delta, 600, SPEC)
    assert status["verdict"] == "DoesNotPay" and status["hitRatio"] == "0.000"
    assert status["unreadShare"] == "1.000" and status["storedBytes"] == 10**6 and status["loadedBytes"] == 0
    assert "does not exceed" in message and "1.000 of the chunks stored were never read" in message


def test_too_few_lookups_are_insufficient_data_whatever_the_ratio() -> None:
    status, message = judge(counts(99, 0), 600, SPEC)
    assert status["verdict"] == "InsufficientData" and status["hitRatio"] == "1.000"
    assert message == "99 lookups in 600 s; the verdict needs 100"


@pytest.mark.parametrize(("overhead_us", "verdict"), [(9_999, "Pays"), (10_000, "DoesNotPay")])
def test_the_break_even_boundary_is_strict(overhead_us: int, verdict: str) -> None:
    """10 hits save 10,000 us: offloading pays only when that exceeds load + overhead."""
    status, _ = judge(counts(10, 90, miss_us=overhead_us), 600, SPEC)
    assert status["verdict"] == verdict


def test_engine_overhead_per_lookup_moves_the_break_even() -> None:
    spec = SPEC.model_copy(
        update={
            "offload_verdict": SPEC.offload_verdict.model_copy(update={"engine_overhead_microseconds_per_lookup": 60})
        }
    )
    assert judge(counts(5, 95), 600, SPEC)[0]["verdict"] == "Pays"
    status, _ = judge(counts(5, 95), 600, spec)  # 5,000 us saved vs 100 lookups * 60 us
    assert status["verdict"] == "DoesNotPay" and status["breakEvenHitRatio"] == "0.0600"


def test_a_larger_l1_is_suggested_when_the_ghosts_say_it_would_have_hit() -> None:
    gi = 1024**3
    ghosts = {"ghost_1.25": 10, "ghost_1.5": 40, "ghost_2": 190, "ghost_3": 200, "ghost_4": 200}
    assert suggest_l1(ghosts, 1000, 300, 4 * gi) == {
        "suggestedL1Size": "8Gi",
        "suggestedL1Bytes": 8 * gi,
        "suggestedHitRatio": "0.490",
    }
    assert suggest_l1({"ghost_4": 9}, 1000, 300, 4 * gi) == {}, "under 1% of the lookups: no suggestion"


def sample_at(at: str, hits: int, misses: int, servers: tuple[str, ...] = ("kv-a/0",)) -> dict[str, Any]:
    usage = ServerUsage(samples={'strata_kv_hits_total{tier="l1"}': hits, "strata_kv_misses_total": misses})
    return sample([(s, usage) for s in servers], at)


def test_the_window_is_over_deltas_and_rotates_after_window_seconds() -> None:
    first = sample_at("2026-12-04T10:00:00Z", 1000, 1000)
    window = advance(None, first, 600)
    assert window == {"current": first}
    later = sample_at("2026-12-04T10:05:00Z", 1100, 1900)
    assert advance(window, later, 600) == {"current": first}, "not yet 600 s: the start stays"
    rotated = advance(window, sample_at("2026-12-04T10:10:00Z", 1200, 2800), 600)
    assert rotated["previous"] == first and rotated["current"]["at"] == "2026-12-04T10:10:00Z"
    status, _ = offload_status(SPEC, {"window": rotated}, sample_at("2026-12-04T10:12:00Z", 1300, 3700))
    assert (status["windowSeconds"], status["lookups"], status["hits"]) == (720, 3000, 300)


def test_a_restarted_or_lost_server_starts_the_window_again() -> None:
    first = sample([("kv-a/0", ServerUsage(samples={"strata_kv_misses_total": 500}))], "2026-12-04T10:00:00Z")
    restarted = sample([("kv-a/1", ServerUsage(samples={"strata_kv_misses_total": 3}))], "2026-12-04T10:01:00Z")
    assert advance({"current": first}, restarted, 600) == {"current": restarted}
    lost = sample([("kv-a/0", ServerUsage()), ("kv-b/0", None)], "2026-12-04T10:01:00Z")
    assert lost["servers"] == "kv-a/0"
    went_back = sample_at("2026-12-04T10:02:00Z", 0, 10)
    assert advance({"current": sample_at("2026-12-04T10:00:00Z", 0, 20)}, went_back, 600) == {"current": went_back}
    status, message = offload_status(SPEC, None, went_back)
    assert status["verdict"] == "InsufficientData" and message.startswith("the window starts now")


def test_a_sample_taken_later_than_the_latest_starts_the_window_again() -> None:
    """Another replica's clock ahead of this one's: no negative window, no verdict over it."""
    ahead = sample_at("2026-12-04T13:00:00Z", 1000, 1000)
    latest = sample_at("2026-12-04T10:02:00Z", 1100, 1900)
    assert advance({"current": ahead}, latest, 30) == {"current": latest}
    status, _ = offload_status(SPEC, {"window": {"current": ahead}}, latest)
    assert status["verdict"] == "InsufficientData"


METRICS = """# TYPE strata_kv_hits_total counter
strata_kv_hits_total{tier="l1"} %d
strata_kv_hits_total{tier="fs"} 0
strata_kv_misses_total %d
strata_kv_offload_miss_seconds_total %f
strata_kv_offload_load_seconds_total{tier="l1"} 0.5
strata_kv_offload_loaded_bytes_total{tier="l1"} 4096
"""


def pod(name: str, restarts: int = 0) -> dict[str, Any]:
    return {
        "metadata": {"name": name},
        "spec": {"nodeName": "n1"},
        "status": {"podIP": "10.0.0.1", "containerStatuses": [{"restartCount": restarts}]},
    }


def test_a_scrape_sets_offload_effective_and_the_status_validates() -> None:
    previous: dict[str, Any] = {}
    verdicts = []
    # From minute 0: 400 hits save 0.4 s; 2,100 more misses then cost 1 s.
    for minute, (hits, misses, miss_seconds) in enumerate([(0, 0, 0.0), (400, 100, 0.01), (400, 2100, 1.0)]):
        servers = [("kv-a/0", parse_metrics(METRICS % (hits, misses, miss_seconds)))]
        now = f"2026-12-04T10:0{minute}:00Z"
        result = plan(
            Observed(TIER, previous=previous, now=now, runtime=RUNTIME, spec=SPEC, full=False, servers=servers)
        )
        KVCacheTierStatus.model_validate(result.status)
        effective = next(c for c in result.status["conditions"] if c["type"] == "OffloadEffective")
        verdicts.append((effective["status"], effective["reason"]))
        previous = result.status
        if minute == 2:
            assert ("Warning", "DoesNotPay") in [(e[0], e[1]) for e in result.events]
    assert verdicts == [("Unknown", "InsufficientData"), ("True", "Pays"), ("False", "DoesNotPay")]
    assert previous["offload"]["loadedBytes"] == 0, "the window is over deltas: no bytes moved in it"
    refreshed = plan(Observed(TIER, previous=previous, runtime=RUNTIME, spec=SPEC, full=False))
    assert refreshed.status["offload"] == previous["offload"], "no scrape: the verdict stays"


# vLLM's exposition of its prefill histograms (two engines' label sets; buckets and counts are ignored).
VLLM_METRICS = """# HELP vllm:request_prefill_time_seconds Histogram of time spent in PREFILL phase for request.
# TYPE vllm:request_prefill_time_seconds histogram
vllm:request_prefill_time_seconds_bucket{engine="0",le="0.3",model_name="m"} 3.0
vllm:request_prefill_time_seconds_count{engine="0",model_name="m"} %d
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} %f
vllm:request_prefill_time_seconds_sum{engine="1",model_name="m"} 0.5
vllm:request_prefill_kv_computed_tokens_sum{engine="0",model_name="m"} %d
vllm:request_prefill_kv_computed_tokens_sum{engine="1",model_name="m"} 1000.0
"""


def test_the_engines_prefill_sums_are_read_over_every_label_set() -> None:
    sums = parse_engine_metrics(VLLM_METRICS % (3, 1.5, 3000))
    assert (sums["prefill_seconds"], sums["prefill_tokens"]) == (2.0, 4000.0)
    assert parse_engine_metrics("# nothing\n") == dict.fromkeys(
        ("prefill_seconds", "prefill_tokens", "store_refusals", "load_refusals"), 0.0
    )


# vLLM's offloading connector's counters of transfers its CPU tier had no room for (one engine).
VLLM_REFUSALS = """# HELP vllm:kv_offload_allocation_failure_total Number of KV offload store allocation attempts...
# TYPE vllm:kv_offload_allocation_failure_total counter
vllm:kv_offload_allocation_failure_total{engine="0",model_name="m"} %d
vllm:kv_offload_tiering_promotion_allocation_failures_total{engine="0",model_name="m",tier="1:StrataTier"} %d
"""


def refusing_engines(at: str, stores: int, loads: int, who: str = "vllm-0/0") -> dict[str, Any]:
    usage = ServerUsage(samples={'strata_kv_hits_total{tier="l1"}': 900, "strata_kv_misses_total": 100})
    metrics = VLLM_METRICS % (1, 1.0, 1000) + VLLM_REFUSALS % (stores, loads)
    return sample([("kv-a/0", usage)], at, [(who, parse_engine_metrics(metrics))])


def test_a_cpu_tier_too_small_for_the_transfers_in_flight_is_named_with_the_setting_to_raise() -> None:
    first, _ = offload_status(SPEC, None, refusing_engines("2026-12-04T10:00:00Z", 5, 0))
    status, message = offload_status(SPEC, first, refusing_engines("2026-12-04T10:01:00Z", 19, 2))
    assert (status["engineStoreRefusals"], status["engineLoadRefusals"]) == (14, 2)
    assert "no room for 14 stores and 2 loads (their chunks were recomputed): raise connector.cpuBytes (4Gi" in message
    quiet, message = offload_status(SPEC, first, refusing_engines("2026-12-04T10:01:00Z", 5, 0))
    assert (quiet["engineStoreRefusals"], quiet["engineLoadRefusals"]) == (0, 0)
    assert "cpuBytes" not in message
    other, _ = offload_status(SPEC, first, refusing_engines("2026-12-04T10:01:00Z", 19, 2, who="vllm-1/0"))
    assert "engineStoreRefusals" not in other, "other engines: their counters do not subtract"


def engines_at(at: str, seconds: float, tokens: int, who: str = "vllm-0/0") -> dict[str, Any]:
    usage = ServerUsage(samples={'strata_kv_hits_total{tier="l1"}': tokens // 10, "strata_kv_misses_total": tokens})
    return sample([("kv-a/0", usage)], at, [(who, parse_engine_metrics(VLLM_METRICS % (1, seconds, tokens)))])


def test_the_engines_measured_prefill_time_replaces_the_setting() -> None:
    first, _ = offload_status(SPEC, None, engines_at("2026-12-04T10:00:00Z", 1.0, 1000))
    # 2,000 more tokens computed in 0.4 s more: 200 us per token (the setting says 10).
    status, _ = offload_status(SPEC, first, engines_at("2026-12-04T10:01:00Z", 1.4, 3000))
    assert (status["recomputeSource"], status["recomputeMicrosecondsPerToken"]) == ("EngineMetrics", 200)
    assert status["recomputeSavedSeconds"] == f"{status['hits'] * 100 * 200 / 1e6:.6f}"
    replaced, _ = offload_status(SPEC, first, engines_at("2026-12-04T10:01:00Z", 1.4, 3000, who="vllm-1/0"))
    assert (replaced["recomputeSource"], replaced["recomputeMicrosecondsPerToken"]) == ("Setting", 10)
    few, _ = offload_status(SPEC, first, engines_at("2026-12-04T10:01:00Z", 1.1, 1500))
    assert few["recomputeSource"] == "Setting", "500 tokens computed: too few to measure"
