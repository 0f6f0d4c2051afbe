"""Capacity used and hit ratios per tier, summed over the servers' Prometheus metrics.

Pure: parsing and summing are tested on real server output; the scraping is the tier's `handlers/kvcachetier/io.py`. The
text format is read here rather than with prometheus_client, which the operator image leaves out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

TIERS = ("l1", "fs", "s3")
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_TIER_LABEL = re.compile(r'tier="([^"]*)"')


@dataclass
class ServerUsage:
    """One server's counters and gauges (what `/metrics` reports)."""

    hits: dict[str, int] = field(default_factory=dict)
    misses: int = 0
    used: dict[str, int] = field(default_factory=dict)
    capacity: dict[str, int] = field(default_factory=dict)
    samples: dict[str, float] = field(default_factory=dict)
    """Every `strata_kv_*` sample as `name` or `name{labels}` → value (the offload verdict reads its counters)."""


def parse_metrics(text: str) -> ServerUsage:
    """Read the `strata_kv_*` families the server exports; anything else is ignored."""
    usage = ServerUsage()
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:  # comments (# HELP, # TYPE) and blank lines
            continue
        tier_match = _TIER_LABEL.search(match.group("labels") or "")
        tier = tier_match.group(1) if tier_match else ""
        name, number = match.group("name"), float(match.group("value"))
        value = int(number)
        if name.startswith("strata_kv_"):
            labels = match.group("labels")
            usage.samples[f"{name}{{{labels}}}" if labels else name] = number
        if name == "strata_kv_hits_total":
            usage.hits[tier] = value
        elif name == "strata_kv_misses_total":
            usage.misses = value
        elif name == "strata_kv_used_bytes":
            usage.used[tier] = value
        elif name == "strata_kv_capacity_bytes":
            usage.capacity[tier] = value
    return usage


def _ratio(part: int, whole: int) -> str:
    """A ratio as a string with three decimals (Kubernetes APIs avoid floats)."""
    return f"{part / whole:.3f}" if whole else "0.000"


def summarize(usages: Iterable[ServerUsage], *, instances: int) -> dict[str, Any]:
    """status.usage: totals per tier over every server that answered, and the overall hit ratio."""
    scraped = list(usages)
    hits = {t: sum(u.hits.get(t, 0) for u in scraped) for t in TIERS}
    misses = sum(u.misses for u in scraped)
    lookups = sum(hits.values()) + misses
    tiers = []
    for tier in TIERS:
        if not any(tier in u.used or u.hits.get(tier) for u in scraped):
            continue
        tiers.append(
            {
                "tier": tier,
                "usedBytes": sum(u.used.get(tier, 0) for u in scraped),
                "capacityBytes": sum(u.capacity.get(tier, 0) for u in scraped),
                "hits": hits[tier],
                "hitRatio": _ratio(hits[tier], lookups),
            }
        )
    return {
        "scrapedInstances": len(scraped),
        "unreachableInstances": instances - len(scraped),
        "lookups": lookups,
        "misses": misses,
        "hitRatio": _ratio(lookups - misses, lookups),
        "tiers": tiers,
    }
