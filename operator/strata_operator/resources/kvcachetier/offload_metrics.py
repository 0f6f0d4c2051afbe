"""status.offload of every tier as Prometheus gauges (the operator's /metrics): the same numbers as the status,
labelled by namespace and tier, for dashboards and alerts.

Pure text rendering in the exposition format (the operator image carries no Prometheus client).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from strata_operator.api.offload import Verdict

PREFIX = "strata_kvcachetier_offload_"
GAUGES: tuple[tuple[str, str, str], ...] = (
    ("hit_ratio", "hitRatio", "Hits / lookups over the verdict's window"),
    ("lookups", "lookups", "Chunk lookups in the window"),
    ("stored_bytes", "storedBytes", "Bytes of chunks stored in the window"),
    ("loaded_bytes", "loadedBytes", "Bytes of chunks loaded back (hits) in the window"),
    ("unread_share", "unreadShare", "Share of the chunks stored in the window that were never read"),
    ("load_seconds", "loadSeconds", "Seconds the servers spent serving hits in the window"),
    ("miss_overhead_seconds", "missOverheadSeconds", "Seconds spent on misses and stores in the window"),
    ("recompute_saved_seconds", "recomputeSavedSeconds", "Prefill seconds the window's hits saved"),
    ("break_even_hit_ratio", "breakEvenHitRatio", "Hit ratio above which offloading pays at the window's costs"),
    ("window_seconds", "windowSeconds", "Seconds the verdict covers"),
    ("suggested_hit_ratio", "suggestedHitRatio", "Hit ratio had L1 been the suggested size"),
    ("engine_store_refusals", "engineStoreRefusals", "Stores the engines' CPU tiers had no room for in the window"),
    ("engine_load_refusals", "engineLoadRefusals", "Loads the engines' CPU tiers had no room for in the window"),
)
"""(metric suffix, status.offload field, help)."""
METRIC_NAMES = (
    *(PREFIX + suffix for suffix, _, _ in GAUGES),
    PREFIX + "suggested_l1_bytes",
    PREFIX + "verdict",
    PREFIX + "tier_hit_ratio",
)


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def render(offloads: Mapping[tuple[str, str], Mapping[str, Any]]) -> str:
    """(namespace, tier name) → status.offload, as gauges; a tier without a verdict yet has none."""
    lines: list[str] = []

    def family(name: str, help_text: str, samples: list[tuple[str, float]]) -> None:
        lines.append(f"# HELP {name} {help_text}")
        lines.append(f"# TYPE {name} gauge")
        lines.extend(f"{name}{{{labels}}} {value:g}" for labels, value in samples)

    tiers = sorted(offloads.items())

    def who(key: tuple[str, str]) -> str:
        return f'namespace="{_label(key[0])}",kvcachetier="{_label(key[1])}"'

    for suffix, field, help_text in GAUGES:
        family(PREFIX + suffix, help_text, [(who(k), float(o[field])) for k, o in tiers if o.get(field) is not None])
    family(
        PREFIX + "suggested_l1_bytes",
        "A larger l1.size that would have lifted the hit ratio (absent: none would)",
        [(who(k), float(o["suggestedL1Bytes"])) for k, o in tiers if o.get("suggestedL1Bytes") is not None],
    )
    family(
        PREFIX + "verdict",
        "1 for the OffloadEffective reason the tier has now (Pays, DoesNotPay, InsufficientData), 0 for the others",
        [
            (f'{who(k)},verdict="{v.value}"', 1.0 if o.get("verdict") == v.value else 0.0)
            for k, o in tiers
            for v in Verdict
        ],
    )
    family(
        PREFIX + "tier_hit_ratio",
        "One tier's hits / all lookups over the window",
        [(f'{who(k)},tier="{_label(t["tier"])}"', float(t["hitRatio"])) for k, o in tiers for t in o.get("tiers", [])],
    )
    return "\n".join(lines) + "\n"
