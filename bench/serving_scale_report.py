"""The serving-scale bench's report, from its JSON alone (`serving_scale.py --report`): ratios against no
offloading, the verdict beside the bench's own gain, the issue's claims checked, a Markdown table and the plot
(throughput vs users, one line per side; the mixed workload; single-request TTFT vs prompt length)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from serving_workload import TOO_CLOSE_TO_CALL, median_range, ratios, verdict_agreement

SIDE_STYLE = {
    "none": ("#888888", "-"),
    "cpu": ("#b0b0b0", "-"),
    "vllm-fs": ("#4a7fc1", "-"),
    "strata-tcp": ("#2e7d32", "-"),
    "strata-socket": ("#1b5e20", "--"),
    "strata-shm": ("#0b3d10", "-."),
    "cpu-x2": ("#c06060", ":"),
    "strata-tcp-x2": ("#66bb6a", ":"),
}
STRATA = ("strata-tcp", "strata-socket", "strata-shm")
NODE_SOCKET_SIDES = ("strata-socket", "strata-shm")
"""The node socket's sides, each checked against `strata-tcp` (it exists to be the faster path)."""


JUDGED_AGAINST = {"strata-tcp-x2": "cpu-x2"}
"""The side a tier's verdict is checked against, where it is not `none`: two engines share two cores, so two
replicas with the tier are judged against two replicas without it, not against one engine."""


def annotate(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Ratios against `none` (and the two-replica sides against `cpu-x2`) at the same point, and whether the
    tier's verdict agrees with the gain over the side it is judged against, in place."""
    ratios(points)
    for baseline in set(JUDGED_AGAINST.values()):
        ratios(points, baseline)
    for p in points:
        if "offload" in p:
            p["verdict_agrees"] = verdict_agreement(p, JUDGED_AGAINST.get(p["side"], "none"))
    return points


def _by(points: Sequence[Mapping[str, Any]], experiment: str) -> dict[str, dict[Any, list[Mapping[str, Any]]]]:
    """Per side and x, the experiment's points: one per round the run measured."""
    out: dict[str, dict[Any, list[Mapping[str, Any]]]] = {}
    for p in points:
        if p["experiment"] == experiment:
            out.setdefault(p["side"], {}).setdefault(p["x"], []).append(p)
    return out


def _median(rounds: Sequence[Mapping[str, Any]], key: str) -> float:
    return float(statistics.median(p[key] for p in rounds))


def _paired(a: Sequence[Mapping[str, Any]], b: Sequence[Mapping[str, Any]], key: str) -> list[float]:
    """`a`'s `key` over `b`'s, round by round (the two sides of one round ran next to each other)."""
    by_round = {p.get("round", 0): p for p in b}
    return [
        p[key] / by_round[p.get("round", 0)][key]
        for p in a
        if p.get("round", 0) in by_round and by_round[p.get("round", 0)][key]
    ]


def _spread(values: Sequence[float]) -> str:
    """A ratio, or over several rounds its median [min-max] and how many."""
    if len(values) == 1:
        return f"{values[0]:.2f}x"
    return f"{statistics.median(values):.2f}x [{min(values):.2f}-{max(values):.2f}], {len(values)} rounds"


def _num(value: Any, fmt: str, unit: str = "") -> str:
    return "-" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt) + unit


def _mib(value: Any) -> str:
    return "-" if value is None else f"{value / 2**20:,.0f}"


def load_table(points: Sequence[Mapping[str, Any]], experiment: str) -> str:
    """One row per point of a load experiment (`scale` or `mixed`), sides in a fixed order within each x."""
    x_name = "users" if experiment == "scale" else "reuse share"
    lines = [
        f"| {x_name} | side | tok/s | vs none | TTFT p50 s | TTFT p99 s | hit ratio | tier hit | loaded MiB "
        "| verdict | server hit | agrees |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = sorted(
        (p for p in points if p["experiment"] == experiment),
        key=lambda p: (p["x"], _order(p["side"]), p.get("round", 0)),
    )
    for p in rows:
        offload = p.get("offload") or {}
        agrees = {True: "yes", False: "**no**", None: "-"}[p.get("verdict_agrees")]
        lines.append(
            f"| {p['x']} | {p['side']} | {p['throughput_tok_s']:,.0f} | {_num(p.get('vs_none'), '.2f', 'x')} "
            f"| {_num(p['ttft_p50_s'], '.3f')} | {_num(p['ttft_p99_s'], '.3f')} | {p['hit_ratio']:.2f} "
            f"| {p['tier_hit_ratio']:.2f} | {_mib(p.get('loaded_bytes'))} | {offload.get('verdict', '-')} "
            f"| {offload.get('hitRatio', '-')} | {agrees} |"
        )
    return "\n".join(lines)


def rounds_table(points: Sequence[Mapping[str, Any]], experiment: str) -> str | None:
    """Where the run measured a side more than once at an x: the median and range over its rounds (None when
    every point was measured once)."""
    series = _by(points, experiment)
    if all(len(rounds) < 2 for row in series.values() for rounds in row.values()):
        return None
    lines = [
        "| x | side | rounds | tok/s, median [range] | TTFT p50 s, median [range] | hit ratio, median "
        "| loaded MiB, median |",
        "|---|---|---|---|---|---|---|",
    ]
    cells = sorted(
        ((x, side, rounds) for side, row in series.items() for x, rounds in row.items()),
        key=lambda cell: (cell[0], _order(cell[1])),
    )
    for x, side, rounds in cells:
        tok = median_range([p["throughput_tok_s"] for p in rounds])
        ttft = median_range([p["ttft_p50_s"] for p in rounds])
        loaded = [p["loaded_bytes"] for p in rounds if p.get("loaded_bytes") is not None]
        lines.append(
            f"| {x} | {side} | {len(rounds)} | {tok[0]:,.0f} [{tok[1]:,.0f}-{tok[2]:,.0f}] "
            f"| {ttft[0]:.3f} [{ttft[1]:.3f}-{ttft[2]:.3f}] | {_median(rounds, 'hit_ratio'):.2f} "
            f"| {_mib(statistics.median(loaded)) if loaded else '-'} |"
        )
    return "\n".join(lines)


def ttft_table(points: Sequence[Mapping[str, Any]]) -> str:
    """Cold (the prompt new) and warm (seen before) TTFT per length; `vs none`: none's warm TTFT (a recompute) over
    the side's; what the tier loaded into the engine over the length's samples."""
    lines = [
        "| document tokens | side | cold TTFT s, median (range) | warm TTFT s, median (range) | vs none | samples "
        "| loaded MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    rows = _by(points, "ttft")
    recompute = {
        x: median_range([t for p in rounds for t in p["warm_ttft_s"]])[0] for x, rounds in rows.get("none", {}).items()
    }
    for p in sorted((p for p in points if p["experiment"] == "ttft"), key=lambda p: (p["x"], _order(p["side"]))):
        cold, warm = median_range(p["cold_ttft_s"]), median_range(p["warm_ttft_s"])
        gain = recompute[p["x"]] / warm[0] if p["x"] in recompute and warm[0] > 0 else None
        lines.append(
            f"| {p['x']} | {p['side']} | {cold[0]:.3f} ({cold[1]:.3f}-{cold[2]:.3f}) "
            f"| {warm[0]:.3f} ({warm[1]:.3f}-{warm[2]:.3f}) | {_num(gain, '.1f', 'x')} | {len(p['warm_ttft_s'])} "
            f"| {_mib(p.get('loaded_bytes'))} |"
        )
    return "\n".join(lines)


def timeline_table(points: Sequence[Mapping[str, Any]]) -> str:
    """Where a warm request's time went, per length and side (medians over its samples, in ms): queued until
    first scheduled (the lookup's answer and the load from the secondary tier happen there), of which the mean
    wait for the lookup answer per chunk and the read from the secondary tier; the prefill (what is left to compute
    and the first token); the rest (HTTP, tokenizing, handing the answer back) is the TTFT less the two. Empty
    where no point has the engine's per-request split (runs before it was recorded)."""
    rows = [p for p in points if p["experiment"] == "ttft" and p.get("warm_timeline")]
    if not rows:
        return ""
    lines = [
        "| document tokens | side | warm TTFT ms | queued ms | lookup wait ms | secondary read ms | prefill ms "
        "| rest ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for p in sorted(rows, key=lambda p: (p["x"], _order(p["side"]))):
        spans = p["warm_timeline"]
        rest = [t - s["queued_s"] - s["prefill_s"] for t, s in zip(p["warm_ttft_s"], spans, strict=True)]
        cells = [statistics.median(p["warm_ttft_s"])]
        cells += [statistics.median(s[k] for s in spans) for k in ("queued_s", "lookup_wait_s", "secondary_read_s")]
        cells += [statistics.median(s["prefill_s"] for s in spans), statistics.median(rest)]
        lines.append(f"| {p['x']} | {p['side']} | " + " | ".join(f"{1000 * c:.1f}" for c in cells) + " |")
    return "\n".join(lines)


def _order(side: str) -> int:
    return list(SIDE_STYLE).index(side) if side in SIDE_STYLE else len(SIDE_STYLE)


def _compared(
    a: Mapping[Any, Sequence[Mapping[str, Any]]], b: Mapping[Any, Sequence[Mapping[str, Any]]]
) -> tuple[list[Any], str]:
    """The users at which two tiers are compared: both measured, and at least one loaded something there (where
    neither did, the engines served from their own KV and the difference is theirs, not the tiers'); and a
    note naming the users left out."""
    both = sorted(set(a) & set(b))
    idle = [u for u in both if not any(p.get("loaded_bytes") for p in (*a[u], *b[u]))]
    note = f"; not compared at U={idle}: neither tier loaded anything" if idle else ""
    return [u for u in both if u not in idle], note


def claims(points: Sequence[Mapping[str, Any]], full_at_users: int) -> list[str]:
    """The issue's claims, each said as what the numbers show (holds / does not hold / not measured)."""
    scale = _by(points, "scale")
    out = []
    past = [u for u in sorted(scale.get("none", {})) if u > full_at_users]
    for side in (*STRATA, "none") if scale else ():
        own = scale.get(side, {})
        if 4 not in own or not past or not all(u in own for u in past):
            out.append(f"{side}: throughput past U={full_at_users} against its own at U=4: not measured")
            continue
        at_four = _median(own[4], "throughput_tok_s")
        kept = [_median(own[u], "throughput_tok_s") / at_four for u in past]
        floor = min(kept)
        verdict = "holds" if floor >= 0.8 else "does not hold"
        label = "keeps >= 0.8x" if side != "none" else "for comparison"
        out.append(
            f"{side}: past U={full_at_users} keeps {floor:.2f}x-{max(kept):.2f}x of its U=4 throughput "
            f"({label}{': ' + verdict if side != 'none' else ''})"
        )
    for side in STRATA:
        own, fs = scale.get(side, {}), scale.get("vllm-fs", {})
        common, idle = _compared(own, fs)
        if not common:
            continue
        against = {u: _paired(own[u], fs[u], "throughput_tok_s") for u in common}
        behind = [u for u in common if against[u] and statistics.median(against[u]) < 1.0]
        verdict = "holds" if not behind else f"does not hold at U={behind}"
        spread = "; ".join(f"U={u} {_spread(against[u])}" for u in common if against[u])
        out.append(f"{side} >= vllm-fs at every U ({common}): {verdict} (tok/s, {side}/vllm-fs: {spread}){idle}")
    tcp = scale.get("strata-tcp", {})
    for side in NODE_SOCKET_SIDES:
        socket = scale.get(side, {})
        common, idle = _compared(socket, tcp)
        if not common:
            continue
        speed = {u: _paired(socket[u], tcp[u], "throughput_tok_s") for u in common}
        wait = {u: _paired(socket[u], tcp[u], "ttft_p50_s") for u in common}
        behind = [
            u
            for u in common
            if speed[u] and wait[u] and (statistics.median(speed[u]) < 1.0 or statistics.median(wait[u]) > 1.0)
        ]
        verdict = "holds" if not behind else f"does not hold at U={behind}"
        ratios = "; ".join(
            f"U={u} {_spread(speed[u])} tok/s, {_spread(wait[u])} TTFT p50" for u in common if speed[u] and wait[u]
        )
        out.append(f"{side} at least as fast as strata-tcp at every U (tok/s, TTFT p50): {verdict} ({ratios}){idle}")
    for pair, single in (("strata-tcp-x2", "strata-tcp"), ("cpu-x2", "cpu")):
        two, one = scale.get(pair, {}), scale.get(single, {})
        for u in sorted(set(two) & set(one)):
            out.append(
                f"U={u}: hit ratio {pair} {_median(two[u], 'hit_ratio'):.2f} vs one replica "
                f"{_median(one[u], 'hit_ratio'):.2f} (tier hit {_median(two[u], 'tier_hit_ratio'):.2f} vs "
                f"{_median(one[u], 'tier_hit_ratio'):.2f})"
            )
    judged = [p for p in points if p.get("verdict_agrees") is not None]
    close = [p for p in points if p.get("verdict_agrees") is None and (p.get("offload") or {}).get("verdict")]
    if judged:
        agree = sum(1 for p in judged if p["verdict_agrees"])
        out.append(f"the tier's verdict agrees with the bench's gain at {agree} of {len(judged)} judged points")
    if close:
        out.append(
            f"not judged: {len(close)} points whose verdict had too little data or whose gain was within "
            f"{TOO_CLOSE_TO_CALL:.0%} of 1 ("
            + ", ".join(f"{p['experiment']} x={p['x']} {p['side']} {p['offload']['verdict']}" for p in close)
            + ")"
        )
    return out


def plot(result: Mapping[str, Any], path: Path) -> None:
    """Throughput vs users (one line per side), the mixed workload, TTFT vs prompt length: the panels there is
    data for."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = result["points"]
    panels = [e for e in ("scale", "mixed", "ttft") if any(p["experiment"] == e for p in points)]
    fig, axes = plt.subplots(1, max(len(panels), 1), figsize=(max(6.2 * len(panels), 9.0), 4.6), squeeze=False)
    for ax, experiment in zip(axes[0], panels, strict=False):
        for side, row in sorted(_by(points, experiment).items(), key=lambda item: _order(item[0])):
            color, style = SIDE_STYLE.get(side, ("black", "-"))
            xs = sorted(row)
            if experiment == "ttft":
                spans = [median_range([t for p in row[x] for t in p["warm_ttft_s"]]) for x in xs]
            else:
                spans = [median_range([p["throughput_tok_s"] for p in row[x]]) for x in xs]
            ys = [span[0] for span in spans]
            below = [span[0] - span[1] for span in spans]
            above = [span[2] - span[0] for span in spans]
            ax.errorbar(xs, ys, yerr=[below, above], marker="o", color=color, linestyle=style, label=side, capsize=3)
        if experiment in ("scale", "ttft"):
            ax.set_xscale("log", base=2)
            xs_all = sorted({x for row in _by(points, experiment).values() for x in row})
            ax.set_xticks(xs_all, [str(x) for x in xs_all])
        if experiment == "scale":
            ax.set_xlabel("concurrent users (each with its own document)")
            ax.set_ylabel("total token throughput (tok/s)")
            full = result.get("settings", {}).get("full_at_users")
            if full:
                ax.axvline(full, color="black", linewidth=0.8, linestyle="--")
                ax.annotate(" engine KV full", (full, ax.get_ylim()[1]), va="top", fontsize=8)
            ax.set_title("Throughput vs users")
        elif experiment == "mixed":
            ax.set_xlabel("share of users who reuse their document")
            ax.set_ylabel("total token throughput (tok/s)")
            ax.set_title(f"Mixed workload, {result.get('settings', {}).get('mixed_users', '?')} users")
        else:
            ax.set_yscale("log")
            ax.set_xlabel("document tokens (prompt: + a 16-token question)")
            ax.set_ylabel("TTFT, median (s): prompt seen before")
            ax.set_title("Single request: TTFT vs document length")
    _save(fig, axes[0][: len(panels)], result, path)


def plot_rounds(result: Mapping[str, Any], path: Path) -> bool:
    """Throughput round by round, one panel per U measured in several rounds, one line per side: what the
    medians hide (a round where one side drew a slow window, or where something else went wrong). False where no
    U has more than one round (nothing drawn)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_x = {x: row for x, row in _rows_by_x(result["points"]).items() if max(len(r) for r in row.values()) > 1}
    if not by_x:
        return False
    fig, axes = plt.subplots(1, len(by_x), figsize=(max(5.2 * len(by_x), 7.0), 4.2), squeeze=False)
    for ax, (x, row) in zip(axes[0], sorted(by_x.items()), strict=True):
        for side, rounds in sorted(row.items(), key=lambda item: _order(item[0])):
            color, style = SIDE_STYLE.get(side, ("black", "-"))
            ax.plot(
                [p.get("round", n) for n, p in enumerate(rounds)],
                [p["throughput_tok_s"] for p in rounds],
                marker="o",
                color=color,
                linestyle=style,
                label=side,
            )
        ax.set_title(f"U={x}: each round")
        ax.set_xlabel("round (sides take turns; the order rotates)")
        ax.set_ylabel("total token throughput (tok/s)")
    _save(fig, axes[0], result, path)
    return True


def _save(fig: Any, axes: Sequence[Any], result: Mapping[str, Any], path: Path) -> None:
    """The figure's panels with their grid and legend, under the run's title, written to `path` and closed."""
    import matplotlib.pyplot as plt

    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(result.get("title", "Serving scale"), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _rows_by_x(points: Sequence[Mapping[str, Any]]) -> dict[Any, dict[str, list[Mapping[str, Any]]]]:
    """The scale experiment's points by U, then by side, in run order."""
    out: dict[Any, dict[str, list[Mapping[str, Any]]]] = {}
    for side, row in _by(points, "scale").items():
        for x, rounds in row.items():
            out.setdefault(x, {})[side] = list(rounds)
    return out


def markdown(result: Mapping[str, Any]) -> str:
    points = result["points"]
    parts = []
    for experiment in ("scale", "mixed"):
        if any(p["experiment"] == experiment for p in points):
            parts.append(load_table(points, experiment))
            spread = rounds_table(points, experiment)
            if spread:
                parts.append(spread)
    if any(p["experiment"] == "ttft" for p in points):
        parts.append(ttft_table(points))
        timelines = timeline_table(points)
        if timelines:
            parts.append(timelines)
    parts.append("\n".join(f"- {line}" for line in claims(points, result.get("settings", {}).get("full_at_users", 8))))
    return "\n\n".join(parts)
