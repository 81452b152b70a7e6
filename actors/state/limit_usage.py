"""How close each limited subject is to its limits, pure: the LimitsActor's ``limits usage``
answer (the dashboard's Spend & limits page), from the counters it owns, no storage read.

Per subject with a limit of its own: each axis it is limited on (``rpm``, ``tpm``,
``concurrency``, ``budget``) with what is used, the limit and their ratio; for a budget also
its soft threshold (USD) and whether it and the budget are crossed in the current period.
``closeness`` is the largest ratio; the answer lists the closest first. A role's default
limit is counted on each key's own counters and is not listed under the role.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from actors.state.limit_counters import Counters
    from schemas.limits import LimitSpec


def _axis(name: str, used: float, limit: float) -> dict[str, Any]:
    return {"axis": name, "used": used, "limit": limit, "ratio": round(used / limit, 6)}


def subject_usage(subject: str, spec: LimitSpec, c: Counters | None, now: float) -> dict[str, Any]:
    """One subject's row (``c`` None: nothing counted yet). ``c`` must be rolled to the
    current budget period first."""
    axes: list[dict[str, Any]] = []
    if spec.rpm is not None:
        axes.append(_axis("rpm", int(c.requests.total(now)) if c else 0, spec.rpm))
    if spec.tpm is not None:
        axes.append(_axis("tpm", int(c.tokens.total(now)) if c else 0, spec.tpm))
    if spec.concurrency is not None:
        axes.append(_axis("concurrency", c.in_flight if c else 0, spec.concurrency))
    if spec.budget_usd is not None:
        spent = c.spent_usd if c else 0.0
        budget = _axis("budget", round(spent, 6), spec.budget_usd)
        soft = None if spec.soft_fraction is None else spec.budget_usd * spec.soft_fraction
        budget.update(
            period=spec.budget_period,
            soft_usd=soft,
            soft_crossed=soft is not None and spent >= soft,
            exhausted=spent >= spec.budget_usd,
        )
        axes.append(budget)
    return {
        "subject": subject,
        "closeness": max((a["ratio"] for a in axes), default=0.0),
        "axes": axes,
    }


def usage_report(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The answer: ``subjects`` closest first (then by name)."""
    rows.sort(key=lambda r: (-r["closeness"], r["subject"]))
    return {"subjects": rows}
