"""The report's plots (matplotlib, the optional ``replay`` extra), as PNG and SVG.

``frontier``: cost against mean TTFT per config, the oracle and the cheapest fill with no
queue marked (a label crowding an earlier one goes under its point). ``timeline-<config>``:
each route's share of the served traffic over time, with benches, circuit openings and
degraded mode marked. Raises ImportError without matplotlib.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import matplotlib

matplotlib.use("Agg")  # files only: no display, no GUI toolkit
import matplotlib.pyplot as plt

if TYPE_CHECKING:
    from pathlib import Path

_FORMATS = ("png", "svg")
# SVG ids and the creation date would change each run; fixed, the files are repeatable.
_META = {"png": {"Software": None}, "svg": {"Date": None}}


def write_plots(report: dict[str, Any], out: Path) -> list[Path]:
    """Write the frontier and one timeline per config into ``out``; the files written."""
    written = _save(_frontier(report), out / "frontier")
    for name, summary in report["configs"].items():
        written += _save(_timeline(name, summary), out / f"timeline-{name}")
    return written


def _save(fig: Any, stem: Path) -> list[Path]:
    paths = []
    with plt.rc_context({"svg.hashsalt": "llmgw-replay"}):
        for fmt in _FORMATS:
            path = stem.with_suffix(f".{fmt}")
            fig.savefig(path, format=fmt, dpi=110, metadata=_META[fmt], bbox_inches="tight")
            paths.append(path)
    plt.close(fig)
    return paths


def _frontier(report: dict[str, Any]) -> Any:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    points: dict[tuple[float, float], list[str]] = {}  # configs that landed on one point
    for name, c in report["configs"].items():
        if c["ttft_mean"] is not None:
            key = (c["ttft_mean"], c["cost_usd"])
            points.setdefault(key, []).append(f"{name} ({100 * c['served_share']:.0f} %)")
    span = max((cost for _, cost in points), default=1.0) or 1.0
    placed: list[tuple[float, float]] = []
    for (ttft, cost), names in sorted(points.items()):
        ax.scatter(ttft, cost, s=36)
        # A label near one already placed (within a fifth in TTFT, 4 % of the cost axis)
        # goes under its point, so two close configs stay readable.
        crowded = any(
            abs(math.log(ttft / t)) < 0.2 and abs(cost - c) < 0.04 * span for t, c in placed
        )
        placed.append((ttft, cost))
        ax.annotate(", ".join(names), (ttft, cost), textcoords="offset points",
                    xytext=(5, -11 if crowded else 4), fontsize=8)  # fmt: skip
    ax.set_xscale("log")
    oracle = report["oracle"]
    if oracle["ttft_mean"] is not None:
        ax.axvline(oracle["ttft_mean"], color="grey", linestyle="--", linewidth=1)
        ax.annotate(" oracle TTFT", (oracle["ttft_mean"], 0), xycoords=("data", "axes fraction"),
                    va="bottom", fontsize=8)  # fmt: skip
    for line, style, text in (
        ("cost_usd", ":", "oracle cost "),
        ("cost_unqueued_usd", "-.", "cheapest fill, no queue "),
    ):
        if oracle.get(line) is not None:
            ax.axhline(oracle[line], color="grey", linestyle=style, linewidth=1)
            ax.annotate(text, (1, oracle[line]), xycoords=("axes fraction", "data"),
                        ha="right", va="bottom", fontsize=8)  # fmt: skip
    ax.set_xlabel("mean TTFT of served requests (s, log)")
    ax.set_ylabel("total cost (USD)")
    ax.set_title("cost against latency per config (served share in brackets)", fontsize=10)
    return fig


def _timeline(name: str, summary: dict[str, Any]) -> Any:
    share = summary["share_by_route"]
    width = share["bucket_seconds"]
    routes = share["routes"]
    fig, ax = plt.subplots(figsize=(7.2, 3.8))
    if routes:
        n = len(next(iter(routes.values())))
        xs = [i * width for i in range(n)]
        ax.stackplot(xs, *routes.values(), labels=list(routes), step="post")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    marks = {"bench:benched": ("red", "-"), "circuit:open": ("black", ":")}
    for at, kind, _endpoint, state in summary["transition_log"]:
        style = marks.get(f"{kind}:{state}")
        if style is not None:
            ax.axvline(at, color=style[0], linestyle=style[1], linewidth=0.8, alpha=0.6)
    since = None
    for at, kind, _endpoint, state in summary["transition_log"]:
        if kind != "mode":
            continue
        if state == "degraded" and since is None:
            since = at
        elif state != "degraded" and since is not None:
            ax.axvspan(since, at, color="orange", alpha=0.15)
            since = None
    if since is not None:
        ax.axvspan(since, summary["virtual_seconds"], color="orange", alpha=0.15)
    ax.set_xlabel("virtual seconds (red: bench, dotted: circuit opened, orange: degraded)")
    ax.set_ylabel(f"served per {width:g} s")
    ax.set_title(f"{name}: traffic per route", fontsize=10)
    return fig
