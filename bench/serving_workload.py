"""The serving-scale bench's workload and its arithmetic, pure (no engine, no I/O): who the users are, what each
turn sends, and what a point's requests and counters add up to. `serving_scale.py` runs it against real engines.

Each user has a long document of its own (token ids drawn from a seed, so every side gets the same documents at a
given point) and asks a stream of short questions about it: turn k sends the document, the conversation so far
(earlier questions and the answers the engine gave) and the new question. A user who does not reuse (the mixed
workload) sends a document never seen before on every turn.
"""

from __future__ import annotations

import math
import random
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpu_vllm import percentile as nearest_rank

FIRST_TOKEN = 3
"""Token ids below this are the tokenizer's specials (unk, bos, eos)."""
WORD = re.compile(r"w(\d+)")
"""The bench model's tokenizer writes token id N as `wN` (gpu_vllm.make_model)."""


@dataclass(frozen=True)
class Workload:
    users: int
    doc_tokens: tuple[int, int] = (2048, 4096)
    question_tokens: int = 32
    answer_tokens: int = 32
    think_seconds: float = 2.0
    reuse_share: float = 1.0
    seed: int = 0
    vocab_size: int = 32000
    max_prompt_tokens: int = 7168
    """A conversation whose next prompt would pass this starts again from the document alone."""


@dataclass
class User:
    index: int
    reuses: bool
    document: list[int]
    think: random.Random
    history: list[int] = field(default_factory=list)
    turn: int = 0


def _tokens(rng: random.Random, count: int, vocab_size: int) -> list[int]:
    return [rng.randrange(FIRST_TOKEN, vocab_size) for _ in range(count)]


def document(workload: Workload, user: int, serial: int = 0) -> list[int]:
    """User `user`'s document number `serial` (a reusing user only ever has serial 0)."""
    rng = random.Random(f"doc/{workload.seed}/{workload.users}/{user}/{serial}")
    return _tokens(rng, rng.randint(*workload.doc_tokens), workload.vocab_size)


def question(workload: Workload, user: int, turn: int) -> list[int]:
    rng = random.Random(f"question/{workload.seed}/{workload.users}/{user}/{turn}")
    return _tokens(rng, workload.question_tokens, workload.vocab_size)


def users(workload: Workload) -> list[User]:
    """The point's users; the first round(reuse_share * users) of them reuse their document."""
    reusing = round(workload.reuse_share * workload.users)
    return [
        User(
            index=u,
            reuses=u < reusing,
            document=document(workload, u),
            think=random.Random(f"think/{workload.seed}/{workload.users}/{u}"),
        )
        for u in range(workload.users)
    ]


def next_prompt(workload: Workload, user: User) -> list[int]:
    """The prompt of the user's next turn (and the turn is counted)."""
    user.turn += 1
    ask = question(workload, user.index, user.turn)
    if not user.reuses:
        return document(workload, user.index, user.turn) + ask
    if len(user.document) + len(user.history) + len(ask) + workload.answer_tokens > workload.max_prompt_tokens:
        user.history = []
    prompt = user.document + user.history + ask
    user.history = user.history + ask
    return prompt


def remember_answer(user: User, answer_text: str) -> None:
    """The engine's answer joins the conversation (its ids, read back from the tokenizer's `wN` words)."""
    if user.reuses:
        user.history = user.history + [int(n) for n in WORD.findall(answer_text)]


def think_seconds(workload: Workload, user: User) -> float:
    """Exponential think time with the workload's mean, from the user's own seeded stream."""
    return user.think.expovariate(1.0 / workload.think_seconds) if workload.think_seconds > 0 else 0.0


# -- a point's numbers ---------------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100, gpu_vllm's); NaN for no values (a point where nothing finished)."""
    return nearest_rank(list(values), q) if values else math.nan


def request_summary(requests: Sequence[Mapping[str, Any]], seconds: float) -> dict[str, Any]:
    """Throughput (prompt and generated tokens of the requests that finished in the point, per second of the
    point), TTFT p50/p99 and counts."""
    ttft = [r["ttft_s"] for r in requests]
    prompt = sum(r["prompt_tokens"] for r in requests)
    output = sum(r["output_tokens"] for r in requests)
    return {
        "requests": len(requests),
        "seconds": seconds,
        "prompt_tokens": prompt,
        "output_tokens": output,
        "throughput_tok_s": (prompt + output) / seconds if seconds > 0 else 0.0,
        "ttft_p50_s": percentile(ttft, 50),
        "ttft_p99_s": percentile(ttft, 99),
    }


STRATA_TIER_METRICS = "vllm:kv_offload_strata_"
"""Strata's tier's own counters in vLLM's metrics (`strata_kv.vllm.tier`): lookups by result, drops by reason."""
BY_OUTCOME = re.compile(r'(?:result|reason)="([^"]+)"')


def metric_sums(text: str) -> dict[str, float]:
    """A Prometheus text page's samples summed over their labels, by name (`_total` kept as the page has it); the
    Strata tier's counters also by outcome (`name:error`, `name:queue_full`), where a point's failures show."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name_labels, _, value = line.rpartition(" ")
        name = name_labels.split("{", 1)[0]
        if name.endswith("_created"):  # when a counter began (a Unix time), not an amount
            continue
        try:
            number = float(value)
        except ValueError:
            continue
        sums[name] = sums.get(name, 0.0) + number
        outcome = BY_OUTCOME.search(name_labels) if name.startswith(STRATA_TIER_METRICS) else None
        if outcome:
            key = f"{name}:{outcome.group(1)}"
            sums[key] = sums.get(key, 0.0) + number
    return sums


def metric_delta(before: Iterable[Mapping[str, float]], after: Iterable[Mapping[str, float]]) -> dict[str, float]:
    """Counters summed over engines (the replicas of a side), after minus before."""
    total: dict[str, float] = {}
    for sign, pages in ((-1.0, before), (1.0, after)):
        for page in pages:
            for name, value in page.items():
                total[name] = total.get(name, 0.0) + sign * value
    return total


def _counter(delta: Mapping[str, float], name: str) -> float:
    return delta.get(name + "_total", delta.get(name, 0.0))


def engine_summary(delta: Mapping[str, float]) -> dict[str, Any]:
    """What the engines' own counters say over the point: the share of prompt tokens not computed (their prefix
    cache or the connector), the connector's share of what the prefix cache missed, and the bytes the tiers
    loaded (into the engine; from a secondary tier into the CPU tier)."""
    queries = _counter(delta, "vllm:prefix_cache_queries")
    local = _counter(delta, "vllm:prefix_cache_hits")
    external_queries = _counter(delta, "vllm:external_prefix_cache_queries")
    external = _counter(delta, "vllm:external_prefix_cache_hits")
    return {
        "hit_ratio": (local + external) / queries if queries else 0.0,
        "engine_hit_ratio": local / queries if queries else 0.0,
        "tier_hit_ratio": external / external_queries if external_queries else 0.0,
        "loaded_bytes": _counter(delta, "vllm:kv_offload_load_bytes"),
        "secondary_read_bytes": _counter(delta, "vllm:kv_offload_tiering_read_bytes"),
        "strata_tier": {
            name.removeprefix(STRATA_TIER_METRICS).replace("_total", ""): value
            for name, value in sorted(delta.items())
            if name.startswith(STRATA_TIER_METRICS) and value
        },
    }


def request_timeline(delta: Mapping[str, float]) -> dict[str, float]:
    """Where one request's time went, from its engine's counters read just before and after it (the request
    alone): queued (from arrival until first scheduled: the secondary tier's lookup and the load into the engine
    happen here), of that the mean wait for the tier's lookup answer per chunk and the time reading from the
    secondary tier, and the prefill (first scheduled to first token: what is computed, and the first token)."""
    lookups = delta.get("vllm:kv_offload_tiering_lookup_async_delay_seconds_count", 0.0)
    return {
        "queued_s": delta.get("vllm:request_queue_time_seconds_sum", 0.0),
        "lookup_wait_s": delta.get("vllm:kv_offload_tiering_lookup_async_delay_seconds_sum", 0.0) / lookups
        if lookups
        else 0.0,
        "secondary_read_s": _counter(delta, "vllm:kv_offload_tiering_read_time"),
        "prefill_s": delta.get("vllm:request_prefill_time_seconds_sum", 0.0),
    }


# -- side by side ------------------------------------------------------------------------------------------
def number_rounds(points: Sequence[dict[str, Any]]) -> None:
    """Each point's `round`: how many points of the same experiment, side and x came before it in the run (a run
    that lists a U twice measures every side twice, in the same rotation), in place; a number already there
    stays."""
    seen: dict[tuple[str, str, Any], int] = {}
    for p in points:
        key = (p["experiment"], p["side"], p["x"])
        p.setdefault("round", seen.get(key, 0))
        seen[key] = seen.get(key, 0) + 1


def ratios(points: Sequence[dict[str, Any]], baseline: str = "none", key: str = "throughput_tok_s") -> None:
    """Each point's `key` over the baseline side's at the same experiment and x (as `vs_<baseline>`), in place:
    the baseline's point of the same round where there is one, else its last."""
    measured = [p for p in points if key in p]
    number_rounds(measured)
    base = {(p["experiment"], p["x"], p["round"]): p[key] for p in measured if p["side"] == baseline}
    last = {(p["experiment"], p["x"]): p[key] for p in measured if p["side"] == baseline}
    for p in measured:
        reference = base.get((p["experiment"], p["x"], p["round"]), last.get((p["experiment"], p["x"])))
        p[f"vs_{baseline}"] = p[key] / reference if reference else None


TOO_CLOSE_TO_CALL = 0.10
"""A side within this share of its baseline's throughput neither gained nor lost as far as one point can tell:
`none` alone served 4,442-5,385 tok/s over four rounds of the same mixed point (2026-12-07)."""


def verdict_agreement(point: Mapping[str, Any], baseline: str = "none") -> bool | None:
    """Does the tier's verdict over the point say what the bench showed (Pays where the side beat `baseline`, the
    same engines without the tier, DoesNotPay where it lost)? None where either is missing, the verdict had too
    little data, or the bench's gain is too close to 1 to call (TOO_CLOSE_TO_CALL)."""
    verdict = (point.get("offload") or {}).get("verdict")
    gain = point.get(f"vs_{baseline}")
    if verdict not in ("Pays", "DoesNotPay") or gain is None or abs(gain - 1.0) < TOO_CLOSE_TO_CALL:
        return None
    return (verdict == "Pays") == (gain > 1.0)


def rotated(sides: Sequence[str], shift: int) -> list[str]:
    """The sides in the order point number `shift` runs them: each point starts one side later."""
    k = shift % len(sides) if sides else 0
    return [*sides[k:], *sides[:k]]


def median_range(values: Sequence[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def over_rounds(points: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> dict[str, dict[str, tuple[float, ...]]]:
    """Per side, each of `keys` as median, min and max over the rounds' points (sides in the order first seen)."""
    by_side: dict[str, list[Mapping[str, Any]]] = {}
    for point in points:
        by_side.setdefault(point["side"], []).append(point)
    return {side: {k: median_range([p[k] for p in rounds]) for k in keys} for side, rounds in by_side.items()}


def kv_cache_lines(log: str) -> list[str]:
    """vLLM's own lines on its KV cache (its size in tokens) in an engine's log, without their logging prefix: the
    proof that the KV memory is what was asked."""
    return [line.split("] ", 1)[-1] for line in log.splitlines() if "KV cache size" in line]
