"""KVCacheTier's offload verdict: the settings it is judged with (spec.offloadVerdict) and what it reports
(status.offload). Kept beside `kvcachetier.py`, which carries one field of each. The same concept one layer
down is `resources/kvcachetier/offload.py`: the pure judgement that fills these models.

Kubernetes APIs avoid floats: times are whole microseconds in the spec, and ratios and seconds are decimal
strings in the status (`usage.hitRatio` does the same).
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import Field

from strata_operator.api.base import CRDModel

SEED_RECOMPUTE_MICROSECONDS_PER_TOKEN = 115
"""576 ms to prefill a 5,000-token document (the measurement DESIGN.md cites), per token."""


class RecomputeSource(StrEnum):
    """Where the recompute time a hit saved comes from."""

    SETTING = "Setting"
    """spec.offloadVerdict.recomputeMicrosecondsPerToken * the tokens the hits loaded."""
    ENGINE_METRICS = "EngineMetrics"
    """The wired engines' measured prefill time per token over the window (vLLM's prefill time and computed-token
    sums), where they computed enough tokens."""


class Verdict(StrEnum):
    """The OffloadEffective condition's reason."""

    PAYS = "Pays"
    DOES_NOT_PAY = "DoesNotPay"
    INSUFFICIENT_DATA = "InsufficientData"


class OffloadVerdictSpec(CRDModel):
    """How the operator judges whether offloading pays (status.offload, the OffloadEffective condition)."""

    recompute_microseconds_per_token: int = Field(
        default=SEED_RECOMPUTE_MICROSECONDS_PER_TOKEN,
        ge=1,
        le=1_000_000,
        description="What prefilling one token costs the engines, in microseconds: a hit of chunkTokens tokens "
        "saves chunkTokens times this. Default 115 (576 ms for a 5,000-token document); measure your model's "
        "(bench/gpu_vllm.py) and set it.",
    )
    engine_overhead_microseconds_per_lookup: int = Field(
        default=0,
        ge=0,
        le=1_000_000,
        description="What each lookup costs the engine beyond the server's own time (connector work, the copy "
        "out of GPU memory for the store that follows a miss), in microseconds; added to the miss overhead. "
        "Default 0: only what the servers measure.",
    )
    engine_metrics_port: int = Field(
        default=8000,
        ge=0,
        le=65535,
        description="Where the tier's consumer pods (label strata.dev/kv-cache-tier) serve vLLM's /metrics: their "
        "measured prefill time per token replaces recomputeMicrosecondsPerToken when they computed 1000 tokens "
        "in the window (recomputeSource EngineMetrics). Default 8000 (vllm serve's port); 0: never ask them.",
    )
    window_seconds: int = Field(
        default=600,
        ge=30,
        le=86400,
        description="The verdict covers at least this long and at most twice it (two scrapes' counters are kept "
        "in status.offload.window). Default 600.",
    )
    min_lookups: int = Field(
        default=1000,
        ge=1,
        description="Fewer lookups than this in the window is InsufficientData. Default 1000.",
    )


class OffloadTier(CRDModel):
    """One tier's share of the window's hits."""

    tier: str = Field(description="l1, fs or s3.")
    hits: int = Field(default=0, description="Lookups this tier answered in the window.")
    hit_ratio: str = Field(default="0.000", description="Its share of all lookups in the window.")
    loaded_bytes: int = Field(default=0, description="Bytes its hits served.")
    load_seconds: str = Field(default="0.000000", description="Seconds the servers spent serving its hits.")


class WindowSample(CRDModel):
    """The servers' counters, summed, at one scrape: the window's start (kept so the verdict is over deltas)."""

    at: str = Field(description="When it was scraped (RFC 3339).")
    servers: str = Field(
        description="The servers it sums (pod and restart count): when they change, counters are not comparable "
        "and the window starts again."
    )
    counters: dict[str, int] = Field(
        default_factory=dict, description="Counter name → value (seconds as whole microseconds)."
    )
    engines: str | None = Field(default=None, description="The consumer engines whose prefill sums it holds.")
    engine_counters: dict[str, int] = Field(
        default_factory=dict, description="Their prefill microseconds and computed tokens, summed."
    )


class OffloadWindow(CRDModel):
    """Two samples: the verdict runs from `previous` (or `current`, until there is one) to the latest scrape."""

    current: WindowSample | None = Field(default=None, description="The newer window start.")
    previous: WindowSample | None = Field(default=None, description="The older one, windowSeconds before it.")


class OffloadStatus(CRDModel):
    """Whether offloading pays, over the window, from the servers' metrics."""

    verdict: Verdict = Field(description="Pays, DoesNotPay or InsufficientData (the OffloadEffective reason).")
    window_seconds: int = Field(default=0, description="Seconds the numbers cover.")
    lookups: int = Field(default=0, description="Chunk lookups in the window.")
    hits: int = Field(default=0, description="Lookups a tier answered.")
    hit_ratio: str = Field(default="0.000", description="hits / lookups.")
    stored_bytes: int = Field(default=0, description="Bytes of chunks stored (offloaded) in the window.")
    loaded_bytes: int = Field(default=0, description="Bytes of chunks loaded back (served by hits).")
    stored_chunks: int = Field(default=0, description="Chunks stored in the window.")
    unread_share: str = Field(
        default="0.000",
        description="Share of the chunks stored in the window that no lookup read while L1 held them: "
        "offloading whose cost bought nothing.",
    )
    evicted_unread: int = Field(default=0, description="Chunks L1 let go in the window without a read.")
    load_seconds: str = Field(default="0.000000", description="Seconds the servers spent serving hits.")
    miss_overhead_seconds: str = Field(
        default="0.000000",
        description="Seconds spent on lookups that missed and on stores (plus engineOverheadMicrosecondsPerLookup "
        "per lookup): what offloading costs whether or not it is reused.",
    )
    recompute_saved_seconds: str = Field(
        default="0.000000", description="Prefill time the hits saved: tokens loaded * recompute time per token."
    )
    recompute_source: RecomputeSource = Field(
        default=RecomputeSource.SETTING, description="Where the recompute time per token came from."
    )
    recompute_microseconds_per_token: int | None = Field(
        default=None, description="The recompute time per token the verdict used (measured or the setting)."
    )
    break_even_hit_ratio: str | None = Field(
        default=None,
        description="The hit ratio above which offloading pays at this window's costs (miss overhead per lookup / "
        "(recompute - load) per hit); absent when a hit costs more to load than to recompute.",
    )
    suggested_l1_size: str | None = Field(
        default=None,
        description="A larger l1.size that would have answered a notable share of the misses (from the eviction "
        "policy's ghosts), as a quantity to paste into l1.size; absent when none would.",
    )
    suggested_l1_bytes: int | None = Field(
        default=None, description="suggestedL1Size in bytes (what the operator's suggested_l1_bytes gauge shows)."
    )
    suggested_hit_ratio: str | None = Field(
        default=None, description="The window's hit ratio had L1 been suggestedL1Size."
    )
    engine_store_refusals: int | None = Field(
        default=None,
        description="Stores the wired engines' CPU tiers had no room for in the window (vLLM's "
        "kv_offload_allocation_failure): those requests' chunks were never offloaded. Above 0: raise "
        "connector.cpuBytes. Absent when the engines were not asked or changed in the window.",
    )
    engine_load_refusals: int | None = Field(
        default=None,
        description="Loads from the tier the engines' CPU tiers had no room for (vLLM's "
        "kv_offload_tiering_promotion_allocation_failures): those chunks were recomputed.",
    )
    tiers: list[OffloadTier] = Field(default_factory=list, description="Hits, bytes and load time per tier.")
    window: OffloadWindow = Field(default_factory=OffloadWindow, description="The samples the window runs from.")
