"""The limits' counters with an injected clock: sliding windows, calendar budgets, leases
(reservation, reconcile, expiry)."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec
import pytest

from actors.state.limit_counters import (
    BUCKET_S,
    Counters,
    CountersSnapshot,
    Lease,
    Refusal,
    Window,
    admit,
    count_unleased,
    period_end,
    period_key,
    settle,
    settle_lapsed,
)
from schemas.limits import LimitSpec

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()  # a Tuesday


def test_window_slides_over_the_last_60_seconds() -> None:
    w = Window()
    w.add(T0, 1)
    w.add(T0 + 30, 1)
    assert w.total(T0 + 59) == 2
    assert w.total(T0 + 60) == 1  # the first left exactly 60 s later
    assert w.total(T0 + 90) == 0


def test_window_says_when_a_need_fits_again() -> None:
    w = Window()
    w.add(T0, 40)
    w.add(T0 + 10, 40)
    assert w.wait_for(T0 + 20, 20, 100) == 0
    assert w.wait_for(T0 + 20, 30, 100) == pytest.approx(40)  # when the first 40 leave
    assert w.wait_for(T0 + 20, 70, 100) == pytest.approx(50)  # both must leave
    assert w.wait_for(T0 + 20, 101, 100) == float("inf")


def test_rpm_admits_up_to_the_limit_then_refuses_until_the_oldest_leaves() -> None:
    spec, c = LimitSpec(rpm=2), Counters()
    holds = [("key:k", spec, c)]
    assert isinstance(admit(holds, "r1", "i", 0, 0.0, T0, 30), Lease)
    assert isinstance(admit(holds, "r2", "i", 0, 0.0, T0 + 20, 30), Lease)
    refused = admit(holds, "r3", "i", 0, 0.0, T0 + 25, 30)
    assert isinstance(refused, Refusal) and refused.code == "rate_limited"
    assert refused.retry_after == pytest.approx(35)
    assert isinstance(admit(holds, "r4", "i", 0, 0.0, T0 + 60, 30), Lease)


def test_tpm_reservation_must_fit_and_settle_reconciles_it() -> None:
    spec, c = LimitSpec(tpm=1000), Counters()
    holds = [("key:k", spec, c)]
    lease = admit(holds, "r1", "i", 600, 0.0, T0, 30)
    assert isinstance(lease, Lease)
    assert isinstance(admit(holds, "r2", "i", 600, 0.0, T0 + 1, 30), Refusal)  # 1200 > 1000
    settle(lease, 100, 0.0, T0 + 2)  # it used 100 of its 600
    assert c.tokens.total(T0 + 2) == 100
    assert isinstance(admit(holds, "r3", "i", 600, 0.0, T0 + 3, 30), Lease)


def test_a_request_longer_than_the_window_counts_what_it_used_beyond_its_reservation() -> None:
    # Its reservation had left the window when it settled, and the correction was dropped:
    # a stream of two minutes that used 50,000 tokens counted 1,000 on a tpm of 10,000.
    spec, c = LimitSpec(tpm=10_000), Counters()
    holds = [("key:k", spec, c)]
    lease = admit(holds, "r1", "i", 1000, 0.0, T0, 300)
    assert isinstance(lease, Lease)
    settle(lease, 50_000, 0.0, T0 + 120)
    assert c.tokens.total(T0 + 120) == 49_000  # the 1,000 reserved were counted their minute
    refused = admit(holds, "r2", "i", 1000, 0.0, T0 + 121, 300)
    assert isinstance(refused, Refusal) and refused.code == "rate_limited"
    short = admit(holds, "r3", "i", 1000, 0.0, T0 + 180, 300)  # a minute after the settle
    assert isinstance(short, Lease)
    settle(short, 10, 0.0, T0 + 250)  # used less than it reserved: nothing more to count
    assert c.tokens.total(T0 + 250) == 0


def test_a_late_settle_of_an_expired_lease_replaces_its_reservation_in_its_period() -> None:
    spec = LimitSpec(tpm=10_000, budget_usd=5.0, budget_period="day")
    for late, spent in ((T0 + 40, 0.2), (T0 + 12 * 3600, 0.2)):  # that day, the next day
        c = Counters()
        lease = admit([("key:k", spec, c)], "r1", "i", 1000, 1.0, T0, 30)
        assert isinstance(lease, Lease)
        settle(lease, lease.tokens, lease.cost_usd, T0 + 31)  # expired: at its reservation
        assert c.spent_usd == pytest.approx(1.0)
        settle_lapsed(lease, 100, 0.2, T0 + 31, late)
        assert c.spent_usd == pytest.approx(spent)  # never 1.2
    assert c.tokens.total(T0 + 12 * 3600) == 0


def test_concurrency_counts_leases_until_settled() -> None:
    spec, c = LimitSpec(concurrency=1), Counters()
    holds = [("key:k", spec, c)]
    lease = admit(holds, "r1", "i", 0, 0.0, T0, 30)
    assert isinstance(lease, Lease)
    assert isinstance(admit(holds, "r2", "i", 0, 0.0, T0, 30), Refusal)
    settle(lease, 0, 0.0, T0 + 1)
    assert c.in_flight == 0
    assert isinstance(admit(holds, "r3", "i", 0, 0.0, T0 + 1, 30), Lease)


def test_budget_is_calendar_monthly_and_refuses_once_spent() -> None:
    spec, c = LimitSpec(budget_usd=1.0, budget_period="month"), Counters()
    holds = [("org:a", spec, c)]
    lease = admit(holds, "r1", "i", 0, 0.4, T0, 30)
    assert isinstance(lease, Lease)
    # Reserved 0.4 + this 0.7 would overshoot: refused until the next month.
    refused = admit(holds, "r2", "i", 0, 0.7, T0, 30)
    assert isinstance(refused, Refusal) and refused.code == "budget_exceeded"
    jan = datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    assert refused.retry_after == pytest.approx(jan - T0)
    settle(lease, 0, 1.2, T0 + 1)  # it cost more than its estimate
    assert c.spent_usd == pytest.approx(1.2)
    assert isinstance(admit(holds, "r3", "i", 0, 0.0, T0 + 2, 30), Refusal)
    assert isinstance(admit(holds, "r4", "i", 0, 0.0, jan, 30), Lease)  # a new month
    assert c.spent_usd == 0


def test_a_budget_refusal_says_whether_it_is_spent_too_small_for_the_request_or_held() -> None:
    # Each said "the monthly budget of $1 is spent", though only one of them was.
    spec, c = LimitSpec(budget_usd=1.0, budget_period="month"), Counters()
    holds = [("org:a", spec, c)]
    lease = admit(holds, "r1", "i", 0, 0.4, T0, 30)
    assert isinstance(lease, Lease)
    held = admit(holds, "r2", "i", 0, 0.7, T0, 30)
    too_big = admit(holds, "r3", "i", 0, 1.5, T0, 30)
    settle(lease, 0, 1.0, T0 + 1)
    spent = admit(holds, "r4", "i", 0, 0.1, T0 + 2, 30)

    assert isinstance(held, Refusal) and isinstance(too_big, Refusal)
    assert isinstance(spent, Refusal)
    assert held.message == (
        "requests still running hold $0.4 of the $1 left of the monthly budget of $1, "
        "too much for this request's $0.7"
    )
    assert too_big.message.startswith("this request may cost up to $1.5 (its max_tokens")
    assert "more than the $1 left of the monthly budget of $1" in too_big.message
    assert spent.message == "the monthly budget of $1 is spent"


def test_admission_is_all_or_nothing_across_subjects() -> None:
    key, org = Counters(), Counters()
    holds = [("key:k", LimitSpec(rpm=10), key), ("org:a", LimitSpec(rpm=1), org)]
    assert isinstance(admit(holds, "r1", "i", 0, 0.0, T0, 30), Lease)
    assert isinstance(admit(holds, "r2", "i", 0, 0.0, T0, 30), Refusal)
    assert key.requests.total(T0) == 1 and key.in_flight == 1  # the refusal took nothing


def test_periods_are_utc_calendar_day_iso_week_and_month() -> None:
    assert period_key("day", T0) == "2026-12-01"
    assert period_key("week", T0) == "2026-W49"
    assert period_key("month", T0) == "2026-12"
    assert period_end("day", T0) == datetime(2026, 12, 2, tzinfo=UTC).timestamp()
    assert period_end("week", T0) == datetime(2026, 12, 7, tzinfo=UTC).timestamp()  # Monday


def test_counters_survive_a_snapshot_round_trip() -> None:
    spec, c = LimitSpec(rpm=5, budget_usd=2.0), Counters()
    count_unleased([("key:k", spec, c)], 50, 0.5, T0, request=True)
    raw = msgspec.json.encode(c.snapshot())  # as the actor stores it
    snap = msgspec.json.decode(raw, type=CountersSnapshot)
    back = Counters.restore(snap, T0 + 10)
    assert back.requests.total(T0 + 10) == 1
    assert back.tokens.total(T0 + 10) == 50
    assert back.spent_usd == 0.5
    assert Counters.restore(snap, T0 + 61).requests.total(T0 + 61) == 0


def test_a_busy_window_keeps_one_bucket_per_slice_and_never_lets_an_amount_go_early() -> None:
    w = Window()
    for i in range(60_000):  # a thousand requests a second for a minute
        w.add(T0 + i / 1000, 1)
    assert w.total(T0 + 59.999) == 60_000
    assert len(w.dump()) <= 60 / BUCKET_S + 1  # bounded however busy: a small snapshot
    w2 = Window()
    w2.add(T0 + 0.01, 1)
    assert w2.total(T0 + 60.01) == 1  # counted no shorter than 60 s (up to a slice longer)
    assert w2.total(T0 + 60 + BUCKET_S) == 0


def test_a_settle_corrects_its_own_share_of_a_shared_bucket() -> None:
    spec, c = LimitSpec(tpm=10_000), Counters()
    holds = [("key:k", spec, c)]
    first = admit(holds, "r1", "i", 600, 0.0, T0, 30)
    second = admit(holds, "r2", "i", 400, 0.0, T0, 30)  # the same slice
    assert isinstance(first, Lease) and isinstance(second, Lease)
    settle(first, 100, 0.0, T0 + 1)
    assert c.tokens.total(T0 + 1) == 500  # 100 used + 400 still reserved


def test_a_changed_budget_period_rolls_at_once() -> None:
    c = Counters()
    count_unleased(
        [("key:k", LimitSpec(budget_usd=5.0, budget_period="day"), c)], 0, 1.0, T0, request=False
    )
    assert c.period == "2026-12-01"
    c.roll(LimitSpec(budget_usd=5.0, budget_period="month"), T0 + 1)
    assert c.period == "2026-12" and c.spent_usd == 0.0
