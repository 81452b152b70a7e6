"""``limits usage``'s rows: each axis used against its limit, the budget's soft threshold and
exhaustion, and the subjects closest to a limit first."""

from __future__ import annotations

from actors.state.limit_counters import Counters
from actors.state.limit_usage import subject_usage, usage_report
from schemas.limits import LimitSpec

NOW = 1_800_000_000.0


def test_each_axis_is_used_against_its_limit_and_the_closest_subject_comes_first() -> None:
    spec = LimitSpec(rpm=10, concurrency=4, budget_usd=2.0, soft_fraction=0.5)
    busy = Counters()
    busy.roll(spec, NOW)
    for _ in range(3):
        busy.requests.add(NOW, 1)
    busy.in_flight = 1
    busy.spent_usd = 1.5  # past the soft threshold (1.0), not the budget

    rows = usage_report(
        [
            subject_usage("key:k-idle", spec, None, NOW),
            subject_usage("key:k-busy", spec, busy, NOW),
        ]
    )["subjects"]

    assert [r["subject"] for r in rows] == ["key:k-busy", "key:k-idle"]
    axes = {a["axis"]: a for a in rows[0]["axes"]}
    assert (axes["rpm"]["used"], axes["rpm"]["ratio"]) == (3, 0.3)
    assert axes["concurrency"]["ratio"] == 0.25
    budget = axes["budget"]
    assert (budget["soft_usd"], budget["soft_crossed"], budget["exhausted"]) == (1.0, True, False)
    assert rows[0]["closeness"] == 0.75
    assert rows[1]["closeness"] == 0.0 and rows[1]["axes"][2]["soft_crossed"] is False
