"""How close each limited subject is to its limits, pure, from the counters the LimitsActor
owns (no storage read): the rate headers of an admission's verdict (:func:`admit_reply`), one
subject's counters now (``limits get``) and the ``limits usage`` answer (the dashboard's Spend
& limits page).

Per subject with a limit of its own: each axis it is limited on (``rpm``, ``tpm``,
``concurrency``, ``budget``) with what is used, the limit and their ratio; for a budget also
its soft threshold (USD) and whether it and the budget are crossed in the current period.
``closeness`` is the largest ratio; the answer lists the closest first. A role's default
limit is counted on each key's own counters and is not listed under the role.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from schemas.limits import AdmitReply

if TYPE_CHECKING:
    from actors.state.limit_counters import Counters, Holds, Refusal
    from schemas.limits import LimitSpec


def admit_reply(pairs: Holds, now: float, refusal: Refusal | None) -> AdmitReply:
    """The verdict (admitted unless ``refusal``) with the rate headers of the tightest
    subject of ``pairs`` on each axis."""
    req_hdr: tuple[int, int, float] | None = None
    tok_hdr: tuple[int, int, float] | None = None
    for _, spec, c in pairs:
        if spec.rpm is not None:
            left = max(0, spec.rpm - int(c.requests.total(now)))
            if req_hdr is None or left < req_hdr[1]:
                req_hdr = (spec.rpm, left, c.requests.reset_in(now))
        if spec.tpm is not None:
            left = max(0, spec.tpm - math.ceil(c.tokens.total(now)))
            if tok_hdr is None or left < tok_hdr[1]:
                tok_hdr = (spec.tpm, left, c.tokens.reset_in(now))
    return AdmitReply(
        admitted=refusal is None,
        code=refusal.code if refusal else "",
        message=refusal.message if refusal else "",
        retry_after=refusal.retry_after if refusal else None,
        limit_requests=req_hdr[0] if req_hdr else None,
        remaining_requests=req_hdr[1] if req_hdr else None,
        reset_requests=req_hdr[2] if req_hdr else None,
        limit_tokens=tok_hdr[0] if tok_hdr else None,
        remaining_tokens=tok_hdr[1] if tok_hdr else None,
        reset_tokens=tok_hdr[2] if tok_hdr else None,
    )


def counters_now(c: Counters | None, now: float) -> dict[str, Any]:
    """One subject's counters as ``limits get`` shows them (``c`` None: nothing counted yet;
    else rolled to the current budget period first)."""
    if c is None:
        return {
            "requests_last_minute": 0,
            "tokens_last_minute": 0,
            "in_flight": 0,
            "spent_usd": 0.0,
            "period": "",
        }
    return {
        "requests_last_minute": int(c.requests.total(now)),
        "tokens_last_minute": int(c.tokens.total(now)),
        "in_flight": c.in_flight,
        "spent_usd": c.spent_usd,
        "period": c.period,
    }


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
