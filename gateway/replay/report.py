"""The replay's report: per config what the clients got, what it cost and what the routing did,
beside the oracle bound; as JSON (byte for byte repeatable) and a Markdown table."""

from __future__ import annotations

import json
import math
from collections import Counter
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Sequence

    from gateway.replay.oracle import Oracle
    from gateway.replay.outcome import RunResult

_SHARE_BUCKETS = 20
_DIGITS = 6


def summarize(run: RunResult, slo: float) -> dict[str, Any]:
    """One config's figures (see the README's replay section for each field)."""
    outcomes = run.outcomes
    served = [o for o in outcomes if o.served]
    ttfts = sorted(o.ttft for o in served if o.ttft is not None)
    errors = Counter("200-broken" if o.broken else str(o.status) for o in outcomes if not o.served)
    attempts = [run.observations.get(o.request_id, []) for o in outcomes]
    all_obs = [ob for per in run.observations.values() for ob in per]
    cost = math.fsum(ob.cost_usd for ob in all_obs)
    violations = sum(1 for o in outcomes if not o.served or o.ttft is None or o.ttft > slo)
    transitions = Counter(f"{t.kind}:{t.state}" for t in run.transitions)
    return {
        "requests": len(outcomes),
        "served": len(served),
        "served_share": _r(len(served) / len(outcomes)) if outcomes else 0.0,
        "errors": dict(sorted(errors.items())),
        "cost_usd": _r(cost),
        "ttft_mean": _r(sum(ttfts) / len(ttfts)) if ttfts else None,
        "ttft_p50": _r(_quantile(ttfts, 0.5)),
        "ttft_p99": _r(_quantile(ttfts, 0.99)),
        "slo_seconds": slo,
        "slo_violations": violations,
        "attempts_per_request": _r(sum(len(a) for a in attempts) / len(outcomes))
        if outcomes
        else 0.0,
        "rate_limited_attempts": sum(1 for ob in all_obs if ob.status == 429),
        "transitions": dict(sorted(transitions.items())),
        "transition_log": [[t.at, t.kind, t.endpoint, t.state] for t in run.transitions],
        "degraded_seconds": _r(_degraded_seconds(run)),
        "share_by_route": _shares(run),
        "billed_tokens": {e: list(v) for e, v in run.billed.items()},
        "probe_tokens": {e: list(v) for e, v in run.probes.items()},
        "virtual_seconds": run.duration,
    }


def build_report(
    runs: Sequence[RunResult], oracle: Oracle, slo: float, seed: int
) -> dict[str, Any]:
    """The whole report: every config's summary, the oracle, per-request differences of each
    config against the first one."""
    base = runs[0] if runs else None
    configs: dict[str, Any] = {}
    for run in runs:
        summary = summarize(run, slo)
        if oracle.ttft_mean and summary["ttft_mean"] is not None:
            summary["ttft_vs_oracle"] = _r(summary["ttft_mean"] / oracle.ttft_mean)
        if oracle.cost_usd:
            summary["cost_vs_oracle"] = _r(summary["cost_usd"] / oracle.cost_usd)
        if base is not None and run is not base:
            summary["versus_first"] = _diff(base, run)
        configs[run.name] = summary
    return {"seed": seed, "oracle": oracle.as_dict(), "configs": configs}


def to_json(report: dict[str, Any]) -> str:
    """The report as JSON text, keys sorted: the same report gives the same bytes."""
    return json.dumps(report, sort_keys=True, indent=1) + "\n"


def to_markdown(report: dict[str, Any]) -> str:
    """The comparison table (one row per config, the oracle's bounds last)."""
    head = (
        "| config | served | errors | mean TTFT | p50 | p99 | SLO viol. | cost $ "
        "| attempts/req | 429s | benches | circuits opened |\n"
        "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    rows = []
    for name, c in report["configs"].items():
        errors = ", ".join(f"{k}: {v}" for k, v in c["errors"].items()) or "none"
        rows.append(
            f"| {name} | {100 * c['served_share']:.1f} % | {errors} | {_s(c['ttft_mean'])} "
            f"| {_s(c['ttft_p50'])} | {_s(c['ttft_p99'])} | {c['slo_violations']} "
            f"| {_usd(c['cost_usd'])} | {c['attempts_per_request']:.2f} "
            f"| {c['rate_limited_attempts']} | {c['transitions'].get('bench:benched', 0)} "
            f"| {c['transitions'].get('circuit:open', 0)} |"
        )
    o = report["oracle"]
    rows.append(
        f"| *oracle* | 100.0 % | | {_s(o['ttft_mean'])} | | | | {_usd(o['cost_usd'])} | | | | |"
    )
    if o.get("cost_unqueued_usd") is not None:
        rows.append(
            f"| *cheapest fill, no queue* | | | | | | | {_usd(o['cost_unqueued_usd'])} | | | | |"
        )
    return head + "\n".join(rows) + "\n"


def _s(seconds: float | None) -> str:
    return "n/a" if seconds is None else f"{seconds:.3f} s"


def _usd(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.4f}"


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, _DIGITS)


def _quantile(sorted_values: list[float], q: float) -> float | None:
    """The nearest-rank quantile of ascending values (None when empty)."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


def _degraded_seconds(run: RunResult) -> float:
    """Virtual seconds spent in degraded mode (to the end of the run when still in it)."""
    total, since = 0.0, None
    for t in run.transitions:
        if t.kind != "mode":
            continue
        if t.state == "degraded" and since is None:
            since = t.at
        elif t.state != "degraded" and since is not None:
            total += t.at - since
            since = None
    if since is not None:
        total += run.duration - since
    return total


def _shares(run: RunResult) -> dict[str, Any]:
    """Served requests per route in equal time buckets over the trace (``bucket_seconds``)."""
    span = max((o.t for o in run.outcomes), default=0.0)
    width = max(1.0, float(math.ceil(span / _SHARE_BUCKETS)))
    routes: dict[str, list[int]] = {}
    buckets = int(span // width) + 1
    for o in run.outcomes:
        if o.served:
            row = routes.setdefault(o.endpoint, [0] * buckets)
            row[min(buckets - 1, int(o.t // width))] += 1
    return {"bucket_seconds": _r(width), "routes": dict(sorted(routes.items()))}


def _diff(base: RunResult, other: RunResult) -> dict[str, Any]:
    """Per request, ``other`` against ``base``: served by one only, and the mean TTFT change
    over requests both served."""
    theirs = {o.id: o for o in other.outcomes}
    only_base = only_other = 0
    deltas: list[float] = []
    for o in base.outcomes:
        t = theirs.get(o.id)
        if t is None:
            continue
        if o.served and not t.served:
            only_base += 1
        elif t.served and not o.served:
            only_other += 1
        elif o.served and o.ttft is not None and t.ttft is not None:
            deltas.append(t.ttft - o.ttft)
    return {
        "served_only_by_first": only_base,
        "served_only_by_this": only_other,
        "ttft_change_mean": _r(sum(deltas) / len(deltas)) if deltas else None,
    }
