"""The messages of a copy that cannot fit (InsufficientStorage): the numbers, what was and was not evicted and why,
and what to change. Kept apart from `eviction` so the decisions there read on one screen."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..capacity import CapacityReport, CapacityRequest

if TYPE_CHECKING:
    from .eviction import Usage


def no_room(req: CapacityRequest, report: CapacityReport, usage: Usage, reserved: int, kept: list[str]) -> str:
    """Why the copy does not fit under the high watermark (and minFree), and what to change."""
    parts = [
        f"the copy needs {report.needed_bytes} more bytes but {req.root} (NodeCachePolicy {req.policy}) has "
        f"{usage.free} free of {usage.capacity} ({usage.used} used); the high watermark {req.high_watermark}% "
        + (f"and minFree {req.min_free_bytes} allow " if req.min_free_bytes else "allows ")
        + f"{report.high_bytes} used"
    ]
    if reserved:
        parts.append(f"{reserved} bytes are reserved by other copies being written")
    parts += _evictions(req, report, kept)
    if not (kept or req.protected or req.protected_more or req.candidates):
        parts.append("no other copy on this node may be evicted")
    parts.append(
        "free space on the node or delete a cache there, or ask the platform team to unpin one or raise the "
        "policy's highWatermark"
    )
    return "; ".join(parts)


def over_budget(
    req: CapacityRequest, report: CapacityReport, namespace: str, used: int, budget: int | None, kept: list[str]
) -> str:
    """Why the copy does not fit its namespace's budget, and what to change (the budget is the platform team's)."""
    parts = [
        f"the copy needs {report.needed_bytes} more bytes but namespace {namespace}'s copies on this node already "
        f"take {used} of its budget of {budget} bytes (NodeCachePolicy {req.policy})"
    ]
    parts += _evictions(req, report, kept)
    parts.append(
        f"delete or unpin another of {namespace}'s caches on this node, or ask the platform team to raise the "
        f"policy's namespaceBudgets for {namespace}"
    )
    return "; ".join(parts)


def _evictions(req: CapacityRequest, report: CapacityReport, kept: list[str]) -> list[str]:
    """What the Job evicted and what it could not (candidates kept on the node, copies the operator kept back)."""
    parts = []
    if report.evicted:
        parts.append("evicted " + ", ".join(f"{e.copy_key} ({e.bytes} bytes)" for e in report.evicted))
    not_evicted = kept + req.protected
    if not_evicted or req.protected_more:
        more = f" and {req.protected_more} more" if req.protected_more else ""
        parts.append("could not evict " + ", ".join(not_evicted) + more)
    return parts
