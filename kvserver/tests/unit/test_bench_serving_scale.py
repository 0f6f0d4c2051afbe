"""The serving-scale bench's pure parts (`bench/serving_scale.py`): the workload it sends, the numbers it adds up,
the verdict it records per point, and the report it draws; the engines it runs are the bench's own business."""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import psutil
import pytest

BENCH = Path(__file__).resolve().parents[3] / "bench"
sys.path.insert(0, str(BENCH))

import serving_scale  # noqa: E402
import serving_scale_report as report  # noqa: E402
import serving_workload as wl  # noqa: E402
from strata_operator.resources.kvcachetier.offload import sample  # noqa: E402
from strata_operator.resources.kvcachetier.usage import ServerUsage  # noqa: E402


def test_the_same_seed_gives_every_side_the_same_documents_and_another_seed_others() -> None:
    first = wl.users(wl.Workload(users=4, seed=1))
    again = wl.users(wl.Workload(users=4, seed=1))
    other = wl.users(wl.Workload(users=4, seed=2))
    assert [u.document for u in first] == [u.document for u in again]
    assert [u.document for u in first] != [u.document for u in other]
    assert all(2048 <= len(u.document) <= 4096 for u in first)
    assert len({tuple(u.document) for u in first}) == 4  # each user a document of its own
    assert all(wl.FIRST_TOKEN <= t < 32000 for u in first for t in u.document)


def test_a_reusing_user_sends_its_document_and_conversation_again_with_each_new_question() -> None:
    workload = wl.Workload(users=1, question_tokens=8, answer_tokens=4)
    (user,) = wl.users(workload)
    first = wl.next_prompt(workload, user)
    wl.remember_answer(user, "w11 w12 w13 w14")
    second = wl.next_prompt(workload, user)
    assert first[: len(user.document)] == second[: len(user.document)] == user.document
    assert second[: len(first)] == first  # the whole first turn is a prefix of the second
    assert second[len(first) : len(first) + 4] == [11, 12, 13, 14]  # the engine's answer, as its token ids
    assert len(second) == len(first) + 4 + 8


def test_a_conversation_that_outgrows_the_limit_starts_again_from_the_document() -> None:
    workload = wl.Workload(users=1, question_tokens=500, max_prompt_tokens=5000)
    (user,) = wl.users(workload)
    lengths = [len(wl.next_prompt(workload, user)) for _ in range(8)]
    assert max(lengths) <= 5000
    assert min(lengths) == len(user.document) + 500
    assert lengths.count(min(lengths)) >= 2  # it came back to the document alone at least once


def test_users_beyond_the_reuse_share_send_a_new_document_every_turn() -> None:
    workload = wl.Workload(users=4, reuse_share=0.5)
    people = wl.users(workload)
    assert [u.reuses for u in people] == [True, True, False, False]
    stranger = people[3]
    one, two = wl.next_prompt(workload, stranger), wl.next_prompt(workload, stranger)
    assert one[:256] != two[:256] and one[:256] != stranger.document[:256]
    wl.remember_answer(stranger, "w5 w6")
    assert stranger.history == []


def test_think_times_follow_the_users_seed() -> None:
    workload = wl.Workload(users=2, think_seconds=2.0)
    a, b = wl.users(workload), wl.users(workload)
    times = [wl.think_seconds(workload, a[0]) for _ in range(200)]
    assert times == [wl.think_seconds(workload, b[0]) for _ in range(200)]
    assert 1.5 < sum(times) / len(times) < 2.5
    assert wl.think_seconds(wl.Workload(users=1, think_seconds=0), a[1]) == 0.0


def test_percentiles_are_nearest_rank_and_throughput_counts_prompt_and_answer_tokens() -> None:
    values = [float(v) for v in range(1, 11)]
    assert wl.percentile(values, 50) == 5.0
    assert wl.percentile(values, 99) == 10.0
    assert math.isnan(wl.percentile([], 50))
    requests = [{"ttft_s": t, "prompt_tokens": 3000, "output_tokens": 32} for t in (0.1, 0.2, 0.9)]
    summary = wl.request_summary(requests, 10.0)
    assert summary["throughput_tok_s"] == (3 * 3032) / 10.0
    assert summary["ttft_p50_s"] == 0.2 and summary["ttft_p99_s"] == 0.9
    assert wl.request_summary([], 10.0)["throughput_tok_s"] == 0.0


ENGINE_PAGE = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{{engine="0",model_name="bench"}} {queries}
vllm:prefix_cache_hits_total{{engine="0",model_name="bench"}} {hits}
vllm:external_prefix_cache_queries_total{{engine="0",model_name="bench"}} {ext_queries}
vllm:external_prefix_cache_hits_total{{engine="0",model_name="bench"}} {ext_hits}
vllm:kv_offload_load_bytes_total{{engine="0",model_name="bench",transfer_type="CPU_to_GPU"}} {loaded}
vllm:kv_offload_tiering_read_bytes_total{{engine="0",tier="StrataTier"}} {read}
vllm:kv_offload_strata_lookup_chunks_total{{engine="0",model_name="bench",result="hit"}} {ext_hits}
vllm:kv_offload_strata_lookup_chunks_total{{engine="0",model_name="bench",result="error"}} {errors}
"""


def page(extra: str = "", **counts: float) -> dict[str, float]:
    return wl.metric_sums(ENGINE_PAGE.format(**counts) + extra)


def test_the_engines_counters_give_the_points_hit_ratios_and_bytes_over_both_replicas() -> None:
    zero = {"queries": 0, "hits": 0, "ext_queries": 0, "ext_hits": 0, "loaded": 0, "read": 0, "errors": 0}
    before = [page(**zero), page(**zero | {"queries": 500, "hits": 500})]
    after = [
        page(  # a counter's first sample for a label comes with the time it was created: not an amount
            'vllm:kv_offload_strata_lookup_chunks_created{engine="0",model_name="bench",result="error"} 1.79e9\n',
            queries=1000,
            hits=200,
            ext_queries=800,
            ext_hits=600,
            loaded=2**20,
            read=2**19,
            errors=3,
        ),
        page(queries=1500, hits=700, ext_queries=800, ext_hits=200, loaded=2**20, read=0, errors=0),
    ]
    summary = wl.engine_summary(wl.metric_delta(before, after))
    # 2000 tokens asked for over the point; the engines' caches had 400, their connectors 800 of the 1600 left.
    assert summary["hit_ratio"] == (400 + 800) / 2000
    assert summary["engine_hit_ratio"] == 400 / 2000
    assert summary["tier_hit_ratio"] == 800 / 1600
    assert summary["loaded_bytes"] == 2 * 2**20
    assert summary["secondary_read_bytes"] == 2**19
    # the Strata tier's own counters by outcome: lookups the server did not answer in time are misses for vLLM
    assert summary["strata_tier"] == {"lookup_chunks": 803, "lookup_chunks:error": 3, "lookup_chunks:hit": 800}


def test_sides_take_turns_at_going_first() -> None:
    sides = ["none", "cpu", "strata-tcp"]
    assert [wl.rotated(sides, n)[0] for n in range(4)] == ["none", "cpu", "strata-tcp", "none"]
    assert sorted(wl.rotated(sides, 2)) == sorted(sides)


def test_rounds_on_the_same_engines_start_every_side_of_an_x_together_and_one_round_starts_each_alone() -> None:
    import argparse

    args = argparse.Namespace(
        users=[16, 64],
        sides=["vllm-fs", "strata-tcp"],
        think_seconds=2.0,
        seed=0,
        mixed_users=0,
        mixed_shares=[0.5],
        mixed_sides=["none"],
        ttft_sides=["none"],
        lengths=[512],
        samples=10,
    )
    one = serving_scale.planned(argparse.Namespace(**vars(args), rounds_per_start=1))
    assert [(e, sides, load.users if load else None) for e, sides, load in one] == [
        ("scale", ["vllm-fs"], 16),
        ("scale", ["strata-tcp"], 16),
        ("scale", ["strata-tcp"], 64),  # the next x starts one side later
        ("scale", ["vllm-fs"], 64),
        ("ttft", ["none"], None),
    ]
    together = serving_scale.planned(argparse.Namespace(**vars(args), rounds_per_start=5))
    assert [(e, sides, load.users if load else None) for e, sides, load in together] == [
        ("scale", ["vllm-fs", "strata-tcp"], 16),
        ("scale", ["strata-tcp", "vllm-fs"], 64),
        ("ttft", ["none"], None),
    ]


def tier_sample(at: str, hits: int, misses: int, loaded: int, load_s: float, prefill_s: float) -> dict[str, object]:
    usage = ServerUsage(
        samples={
            'strata_kv_hits_total{tier="l1"}': hits,
            "strata_kv_misses_total": misses,
            'strata_kv_offload_loaded_bytes_total{tier="l1"}': loaded,
            'strata_kv_offload_load_seconds_total{tier="l1"}': load_s,
        }
    )
    engines = [("engine/0", {"prefill_seconds": prefill_s, "prefill_tokens": 1000.0 * prefill_s})]
    return sample([("bench/0", usage)], at, engines)


def test_the_verdict_of_a_point_covers_only_what_happened_during_it() -> None:
    import serving_measure

    spec = serving_measure.verdict_spec(min_lookups=50)
    # Before the point the server had answered 900 lookups (all hits); during it, 100 more, 10 of them hits.
    before = tier_sample("2026-12-06T08:00:00Z", hits=900, misses=0, loaded=900 * 2**20, load_s=0.9, prefill_s=10)
    after = tier_sample("2026-12-06T08:00:20Z", hits=910, misses=90, loaded=910 * 2**20, load_s=0.91, prefill_s=30)
    status = serving_measure.judged(spec, before, after)
    assert status["lookups"] == 100 and status["hits"] == 10 and status["hitRatio"] == "0.100"
    assert status["loadedBytes"] == 10 * 2**20
    assert status["windowSeconds"] == 20
    assert status["recomputeSource"] == "EngineMetrics"  # 20 s of prefill over 20,000 tokens: 1000 us a token
    assert status["recomputeMicrosecondsPerToken"] == 1000
    assert status["verdict"] == "Pays"  # 10 hits x 256 tokens x 1 ms saved 2.56 s against 0.01 s of loading


def point(side: str, users: int, tok_s: float, hit: float, verdict: str | None = None) -> dict[str, object]:
    p: dict[str, object] = {
        "experiment": "scale",
        "side": side,
        "x": users,
        "throughput_tok_s": tok_s,
        "ttft_p50_s": 0.5,
        "ttft_p99_s": 2.0,
        "hit_ratio": hit,
        "tier_hit_ratio": hit,
        "loaded_bytes": 2**30,
    }
    if verdict:
        p["offload"] = {"verdict": verdict, "hitRatio": f"{hit:.3f}"}
    return p


def small_result() -> dict[str, object]:
    points = [
        point("none", 4, 3000, 0.9),
        point("strata-tcp", 4, 3300, 0.95, "Pays"),
        point("vllm-fs", 4, 3200, 0.95),
        point("none", 16, 1000, 0.2),
        point("strata-tcp", 16, 2900, 0.9, "DoesNotPay"),
        point("strata-socket", 16, 2610, 0.9),
        point("strata-shm", 16, 3045, 0.9),
        point("vllm-fs", 16, 3000, 0.9),
        point("strata-tcp-x2", 16, 2500, 0.88, "Pays"),
        point("strata-tcp-x2", 4, 2000, 0.9, "Pays"),  # below one engine, above two without the tier
        point("cpu-x2", 4, 1800, 0.5),
        point("cpu-x2", 16, 1500, 0.45),
        point("cpu", 16, 2000, 0.6),
    ]
    return {"title": "test", "settings": {"full_at_users": 8}, "points": points}


def test_the_report_puts_each_side_beside_no_offloading_and_checks_the_claims(tmp_path: Path) -> None:
    result = small_result()
    points = report.annotate(result["points"])  # type: ignore[arg-type]
    strata16 = next(p for p in points if p["side"] == "strata-tcp" and p["x"] == 16)
    assert strata16["vs_none"] == 2.9
    assert strata16["verdict_agrees"] is False  # the bench shows a gain, the verdict said DoesNotPay
    assert next(p for p in points if p["side"] == "strata-tcp" and p["x"] == 4)["verdict_agrees"] is True
    two = next(p for p in points if p["side"] == "strata-tcp-x2" and p["x"] == 4)
    assert two["vs_none"] < 1 and two["verdict_agrees"] is True  # judged against cpu-x2: two engines on two cores
    text = report.markdown(result)
    assert (
        "| 16 | strata-tcp | 2,900 | 2.90x | 0.500 | 2.000 | 0.90 | 0.90 | 1,024 | DoesNotPay | 0.900 | **no** |"
        in text
    )
    assert "strata-tcp: past U=8 keeps 0.88x-0.88x of its U=4 throughput (keeps >= 0.8x: holds)" in text
    assert "strata-tcp >= vllm-fs at every U ([4, 16]): does not hold at U=[16]" in text
    assert (
        "strata-socket at least as fast as strata-tcp at every U (tok/s, TTFT p50): does not hold at U=[16] "
        "(U=16 0.90x tok/s, 1.00x TTFT p50)" in text
    )
    assert "strata-shm at least as fast as strata-tcp at every U (tok/s, TTFT p50): holds (U=16 1.05x tok/s" in text
    assert "strata-shm >= vllm-fs at every U ([16]): holds" in text
    assert "U=16: hit ratio strata-tcp-x2 0.88 vs one replica 0.90" in text
    assert "U=16: hit ratio cpu-x2 0.45 vs one replica 0.60" in text
    assert "the tier's verdict agrees with the bench's gain at 3 of 4 judged points" in text
    report.plot(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert report.plot_rounds(result, tmp_path / "rounds.png") is False  # one round per U: nothing to draw
    assert not (tmp_path / "rounds.png").exists()
    again = {**result, "points": [*result["points"], *(dict(p) for p in result["points"] if p["x"] == 16)]}
    assert report.plot_rounds(again, tmp_path / "rounds.png") is True
    assert (tmp_path / "rounds.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_warm_requests_time_is_split_by_its_engines_counters_and_the_report_shows_the_rest() -> None:
    before = {"vllm:request_queue_time_seconds_sum": 4.0, "vllm:request_queue_time_seconds_count": 7.0}
    after = {
        "vllm:request_queue_time_seconds_sum": 4.05,
        "vllm:request_queue_time_seconds_count": 8.0,
        "vllm:request_prefill_time_seconds_sum": 0.02,
        # 64 chunks waited 0.64 s in all for the lookup's answer: 10 ms each, all in one batch
        "vllm:kv_offload_tiering_lookup_async_delay_seconds_sum": 0.64,
        "vllm:kv_offload_tiering_lookup_async_delay_seconds_count": 64.0,
        "vllm:kv_offload_tiering_read_time_total": 0.03,
    }
    split = wl.request_timeline(wl.metric_delta([before], [after]))
    expected = {"queued_s": 0.05, "lookup_wait_s": 0.01, "secondary_read_s": 0.03, "prefill_s": 0.02}
    assert split == pytest.approx(expected)
    assert wl.request_timeline({})["lookup_wait_s"] == 0.0  # a side without a secondary tier waits for none
    ttft = {"experiment": "ttft", "side": "strata-tcp", "x": 2048, "cold_ttft_s": [0.9, 0.9, 0.9]}
    points = [
        ttft | {"warm_ttft_s": [0.08, 0.09, 0.12], "warm_timeline": [split, split, split | {"prefill_s": 0.04}]},
        ttft | {"side": "vllm-fs", "warm_ttft_s": [0.05]},  # measured before the split was recorded: no row
    ]
    table = report.timeline_table(points)
    assert "| 2048 | strata-tcp | 90.0 | 50.0 | 10.0 | 30.0 | 20.0 | 20.0 |" in table
    assert "vllm-fs" not in table
    assert report.timeline_table(points[1:]) == ""


def test_the_plot_has_a_panel_for_the_mixed_workload_and_for_ttft_by_length(tmp_path: Path) -> None:
    result = small_result()
    result["points"] = [  # type: ignore[index]
        {**point("none", 0, 900, 0.1), "experiment": "mixed", "x": 0.0},
        {**point("none", 0, 1900, 0.5), "experiment": "mixed", "x": 0.5},
        {"experiment": "ttft", "side": "strata-tcp", "x": 512, "cold_ttft_s": [0.2, 0.3], "warm_ttft_s": [0.02]},
        {
            "experiment": "ttft",
            "side": "strata-tcp",
            "x": 2048,
            "cold_ttft_s": [0.9],
            "warm_ttft_s": [0.05, 0.07],
            "loaded_bytes": 2 * 8 * 2**20,
        },
        {"experiment": "ttft", "side": "none", "x": 2048, "cold_ttft_s": [0.8], "warm_ttft_s": [0.6, 0.8, 0.7]},
    ]
    report.annotate(result["points"])  # type: ignore[arg-type]
    report.plot(result, tmp_path / "plot.png")
    assert (tmp_path / "plot.png").stat().st_size > 0
    text = report.markdown(result)
    assert "| 2048 | strata-tcp | 0.900 (0.900-0.900) | 0.060 (0.050-0.070) | 11.7x | 2 | 16 |" in text
    assert "| 512 | strata-tcp | 0.250 (0.200-0.300) | 0.020 (0.020-0.020) | - | 1 | - |" in text
    assert "| 0.5 | none | 1,900 |" in text


def test_the_engines_kv_memory_holds_about_the_users_asked_for_and_the_cpu_tier_as_many() -> None:
    import serving_scale

    # 8 layers x 2 KV heads x 64 wide, keys and values in bf16: the 1 MiB per 256-token chunk the server stores.
    assert serving_scale.kv_bytes_per_token() * 256 == 2**20
    size = serving_scale.sizing(full_at_users=8, cpu_tier_users=8)
    per_user = serving_scale.MEAN_DOC_TOKENS + serving_scale.CONVERSATION_TOKENS
    assert size["engine_kv_tokens"] == size["engine_blocks"] * 32 == 8 * per_user
    assert size["cpu_bytes"] == f"{8 * per_user * 4096 // 2**20}Mi"


def test_rounds_add_up_to_each_sides_median_and_spread_kept_apart() -> None:
    points = [
        {"side": "with tier", "tok_s": 300.0},
        {"side": "without", "tok_s": 100.0},
        {"side": "without", "tok_s": 90.0},
        {"side": "with tier", "tok_s": 250.0},
        {"side": "with tier", "tok_s": 320.0},
        {"side": "without", "tok_s": 140.0},
    ]
    assert wl.over_rounds(points, ["tok_s"]) == {
        "with tier": {"tok_s": (300.0, 250.0, 320.0)},
        "without": {"tok_s": (100.0, 90.0, 140.0)},
    }


def test_the_engines_kv_memory_is_read_from_vllms_own_lines() -> None:
    size = "CPU KV cache size: 3,072 tokens, Maximum concurrency for 2,048 tokens per request: 1.50x"
    log = (
        "(EngineCore pid=80) INFO 12-07 03:01:02 [core.py:95] Initializing a V1 LLM engine\n"
        f"(EngineCore pid=80) INFO 12-07 03:01:09 [kv_cache_utils.py:2328] {size}\n"
        "(APIServer pid=1) INFO 12-07 03:01:19 [loggers.py:259] Engine 000: Avg prompt throughput: 82.4 tokens/s, "
        "Running: 0 reqs, CPU KV cache usage: 0.0%, Prefix cache hit rate: 0.0%\n"
    )
    assert wl.kv_cache_lines(log) == [size]


def test_a_failed_point_keeps_the_engines_first_errors_and_the_end_of_its_log() -> None:
    log = "\n".join(
        ["INFO starting"] * 50
        + ["(EngineCore pid=1) ERROR 12-07 06:03:05 [core.py:1] AssertionError: the root cause"]
        + ["INFO shutting down"] * 500
    )
    kept = serving_scale.failure_excerpt(log, tail=200)
    assert kept.startswith("(EngineCore pid=1) ERROR 12-07 06:03:05 [core.py:1] AssertionError: the root cause\n...\n")
    assert kept.endswith("INFO shutting down") and len(kept) < 400
    assert serving_scale.failure_excerpt("INFO only", tail=200) == "INFO only"


def test_a_side_measured_in_several_rounds_is_compared_round_by_round_and_shown_with_its_spread() -> None:
    points = [  # two rounds at U=64, each side next to the others of its round
        point("vllm-fs", 64, 1000, 0.9),
        point("strata-tcp", 64, 1100, 0.9),
        point("strata-socket", 64, 900, 0.8),
        point("vllm-fs", 64, 2000, 0.9),
        point("strata-tcp", 64, 1800, 0.9),
        point("strata-socket", 64, 2000, 0.9),
    ]
    result = {"title": "test", "settings": {"full_at_users": 8}, "points": points}
    report.annotate(points)  # type: ignore[arg-type]
    assert [p["round"] for p in points] == [0, 0, 0, 1, 1, 1]
    text = report.markdown(result)
    # round by round: 1.10x and 0.90x, not the first round's tcp over the second round's fs
    assert (
        "strata-tcp >= vllm-fs at every U ([64]): holds (tok/s, strata-tcp/vllm-fs: U=64 1.00x [0.90-1.10], 2 rounds)"
        in text
    )
    assert "U=64 0.96x [0.82-1.11], 2 rounds tok/s" in text
    assert "| 64 | strata-socket | 2 | 1,450 [900-2,000] | 0.500 [0.500-0.500] | 0.85 | 1,024 |" in text


def test_points_measured_once_get_no_spread_table() -> None:
    assert report.rounds_table(small_result()["points"], "scale") is None  # type: ignore[arg-type]


def test_runs_merged_into_one_report_make_a_side_measured_again_its_next_round() -> None:
    def run(date: str, tok_s: float, mixed_users: int = 0) -> dict[str, object]:
        settings = {"engine_blocks": 896, "cpu_bytes": "112Mi", "seed": 0, "mixed_users": mixed_users}
        first = point("strata-tcp", 64, tok_s, 0.9)
        return {"date": date, "plan": "sweep", "settings": settings, "points": [first], "errors": []}

    one, two = run("2026-12-06", 1000), run("2026-12-07", 1200, mixed_users=16)
    report.annotate(one["points"])  # type: ignore[arg-type]
    report.annotate(two["points"])  # type: ignore[arg-type]
    both = serving_scale.merged([one, two])
    report.annotate(both["points"])
    assert [(p["round"], p["run"]) for p in both["points"]] == [(0, "2026-12-06"), (1, "2026-12-07")]
    assert both["settings"]["mixed_users"] == 16
    assert [r["points"] for r in both["runs"]] == [1, 1]
    # a side the first run did not measure starts where that run's rounds end: compared within its own run
    one["points"] = [point("vllm-fs", 64, 2000, 0.9), point("strata-tcp", 64, 1000, 0.9)]
    two["points"] = [point(side, 64, tok_s, 0.9) for side, tok_s in (("vllm-fs", 1000), ("strata-shm", 1100))]
    both = serving_scale.merged([one, two])
    assert [(p["side"], p["round"]) for p in both["points"]] == [
        ("vllm-fs", 0),
        ("strata-tcp", 0),
        ("vllm-fs", 1),
        ("strata-shm", 1),
    ]
    wl.ratios(both["points"], "vllm-fs")
    assert both["points"][3]["vs_vllm-fs"] == pytest.approx(1.1)  # against the fs point of its run, not 2000
    other = run("2026-12-08", 1000)
    other["settings"]["engine_blocks"] = 448  # type: ignore[index]
    with pytest.raises(SystemExit, match="engine_blocks"):
        serving_scale.merged([one, other])


def test_a_points_cpu_seconds_count_the_engines_children(tmp_path: Path) -> None:
    """vLLM's engine core and workers are children of the API server the bench starts: their CPU counts."""
    import subprocess

    import serving_measure

    done = tmp_path / "done"
    burn = f"x = sum(i * i for i in range(3_000_000)); open({str(done)!r}, 'w').close(); import time; time.sleep(60)"
    parent = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys; subprocess.run([sys.executable, '-c', {burn!r}])"]
    )
    try:
        while not done.exists():
            assert parent.poll() is None
            time.sleep(0.05)
        alone = sum(psutil.Process(parent.pid).cpu_times()[:2])  # the parent waits on its child meanwhile
        assert serving_measure.cpu_seconds([parent.pid]) > alone + 0.05
        assert serving_measure.cpu_seconds([2**22 + 12345]) == 0.0  # gone: nothing, no error
    finally:
        for child in psutil.Process(parent.pid).children(recursive=True):
            child.kill()
        parent.kill()
        parent.wait()


def test_tiers_are_not_compared_where_neither_loaded_anything() -> None:
    points = [
        {**point("vllm-fs", 4, 5000, 0.99), "loaded_bytes": 0.0},
        {**point("strata-tcp", 4, 4800, 0.99), "loaded_bytes": 0.0},  # the engines' own difference: no tier at work
        point("vllm-fs", 16, 3000, 0.9),
        point("strata-tcp", 16, 3100, 0.9),
    ]
    report.annotate(points)
    text = "\n".join(report.claims(points, 8))
    assert (
        "strata-tcp >= vllm-fs at every U ([16]): holds (tok/s, strata-tcp/vllm-fs: U=16 1.03x); "
        "not compared at U=[4]: neither tier loaded anything" in text
    )


def test_a_gain_too_close_to_one_is_not_held_for_or_against_the_verdict() -> None:
    points = [
        {**point("none", 0, 4500, 0.0), "experiment": "mixed", "x": 0.0},
        {**point("strata-tcp", 0, 4700, 0.0, "DoesNotPay"), "experiment": "mixed", "x": 0.0},  # 1.04x: noise
        {**point("none", 0, 4500, 0.0), "experiment": "mixed", "x": 0.5},
        {**point("strata-tcp", 0, 7000, 0.45, "Pays"), "experiment": "mixed", "x": 0.5},
    ]
    report.annotate(points)
    assert [p.get("verdict_agrees") for p in points] == [None, None, None, True]
    text = "\n".join(report.claims(points, 8))
    assert "agrees with the bench's gain at 1 of 1 judged points" in text
    assert "not judged: 1 points whose verdict had too little data or whose gain was within 10% of 1 " in text
