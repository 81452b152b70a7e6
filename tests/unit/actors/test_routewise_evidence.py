"""RouteWise's evidence at high request rates: bounded windows that keep following the
endpoint, and failures counted exactly as the library counts them."""

from __future__ import annotations

import pytest
from llm_routewise.core.latency_profile import RollingLatencyProfile

from actors.strategies.routewise.evidence import (
    ENVELOPE_MAX_SAMPLES,
    ERROR_PENALTY_MS,
    CostEnvelope,
    LatencyEvidence,
    SampleThinner,
    TtftWindow,
)
from actors.strategies.routewise.params import RouteWiseParams

RATE = 200.0  # samples per second on one endpoint: what one busy route sees


def feed(evidence: LatencyEvidence, ttft_ms: float, start: float, seconds: float) -> float:
    """``seconds`` of successes at RATE; returns the time after the last one."""
    n = int(seconds * RATE)
    for i in range(n):
        evidence.success("a", ttft_ms, start + i / RATE)
    return start + n / RATE


def test_a_window_at_a_high_rate_stays_bounded_and_follows_a_latency_shift() -> None:
    params = RouteWiseParams(
        latency_window_sec=900.0,
        latency_max_samples_per_profile=5000,
        latency_fast_half_life_sec=0.0,  # the window alone
    )
    evidence = LatencyEvidence(params)
    now = feed(evidence, 50.0, 0.0, 100.0)  # 20,000 samples: four times the budget
    assert evidence.estimate("a", now) == pytest.approx(50.0)
    now = feed(evidence, 500.0, now, 450.0)  # the endpoint slows down for half a window
    # Every sample of the window would give (100 * 50 + 450 * 500) / 550 = 418 ms; the
    # thinned window is an even draw over the same time. A window that stopped taking
    # samples once full would still say 50 ms.
    assert evidence.estimate("a", now) == pytest.approx(418.0, rel=0.1)
    assert evidence.samples("a", now) <= 5000 * 1.05 + 1


def test_the_estimate_follows_a_slowdown_in_seconds_and_an_idle_route_returns_to_its_window() -> (
    None
):
    evidence = LatencyEvidence(RouteWiseParams())  # half-life 2 s, the window weighs 3
    for i in range(600):  # ten minutes at one a second: the window says 100 ms
        evidence.success("a", 100.0, float(i))
    for i in range(20):  # a queue builds: two seconds at ten a second, 2 s each
        evidence.success("a", 2000.0, 600.0 + i / 10)

    assert (evidence.estimate("a", 602.0) or 0.0) > 1000.0  # the window alone: about 160 ms
    assert evidence.estimate("a", 640.0) == pytest.approx(160.0, rel=0.05)  # forty idle seconds


def test_the_thinner_takes_a_burst_at_once_then_its_rate() -> None:
    thinner = SampleThinner(budget=1000, window_sec=100.0)
    taken_at_once = sum(thinner.admit(0.0) for _ in range(500))
    assert taken_at_once == 50  # a twentieth of the budget: a cold route learns at once
    taken = sum(thinner.admit(t / 100.0) for t in range(1, 100 * 100 + 1))  # 100 s more
    assert taken == pytest.approx(950, abs=2)  # (budget - burst) per window, evenly
    assert not thinner.admit(50.0)  # a replayed older sample refills nothing


def test_the_thinner_says_when_its_next_token_is_whole() -> None:
    """``due`` lets a hot path skip ``admit`` for a sample before it: none is kept there, and
    the first sample at it is."""
    thinner = SampleThinner(budget=1000, window_sec=100.0)  # burst 50, then 9.5 a second
    assert thinner.due == float("-inf")  # a token is whole: any sample may be kept
    assert sum(thinner.admit(0.0) for _ in range(50)) == 50
    assert thinner.due == pytest.approx(1 / 9.5)
    assert not thinner.admit(thinner.due * 0.999)
    assert thinner.admit(thinner.due)


def test_a_sample_moves_the_estimate_within_its_second_kept_or_thinned() -> None:
    """The windows' mean is read once per kept sample or second: a kept sample moves the
    estimate at once; a thinned one moves it through the fast mean only."""
    alone = LatencyEvidence(RouteWiseParams(latency_fast_half_life_sec=0.0))
    alone.success("a", 100.0, 10.0)
    assert alone.lp_latency("a", 10.1) == (100.0, True)
    alone.success("a", 300.0, 10.2)  # kept (the burst), the same second
    assert alone.lp_latency("a", 10.3) == (200.0, True)
    blended = LatencyEvidence(RouteWiseParams(latency_max_samples_per_profile=20))  # burst 1
    blended.success("a", 100.0, 10.0)
    before = blended.estimate("a", 10.1)
    blended.success("a", 900.0, 10.2)  # thinned away: the window still says 100
    assert blended.estimate("a", 10.3) != before
    assert blended._means["a"][3] == 100.0


def test_a_slow_feed_is_never_thinned() -> None:
    thinner = SampleThinner(budget=5000, window_sec=900.0)
    assert all(thinner.admit(float(t)) for t in range(10_000))  # one a second


def test_failures_count_as_the_library_counts_them() -> None:
    ours, theirs = TtftWindow(60.0, 5000), RollingLatencyProfile(window_sec=60.0)
    for ts, ttft_ms in ((0.0, 100.0), (10.0, 300.0), (20.0, None), (30.0, 200.0), (35.0, None)):
        if ttft_ms is None:
            ours.failure(ts)
            theirs.add_error(ts, "error")
        else:
            ours.success(ts, ttft_ms)
            theirs.add_sample(ts, ttft_ms)
    for now in (36.0, 65.0, 85.0, 94.0, 200.0):
        assert ours.errors(now) == theirs.error_count(now)
        assert ours.mean_with_errors(now) == pytest.approx(
            theirs.mean_with_errors(now, error_penalty_ms=ERROR_PENALTY_MS)
        )
        for ms in (150.0, 250.0, 1000.0):
            assert ours.cdf_counting_errors(ms, now) == pytest.approx(
                theirs.cdf_counting_errors(ms, now)
            )


def test_old_failures_are_dropped_beyond_two_windows() -> None:
    window = TtftWindow(10.0, 5000)
    for ts in range(100):
        window.failure(float(ts))
    assert window.errors(99.0) == 11  # 89 .. 99
    assert len(window._errors) <= 22  # two windows kept, the rest cut


def test_the_cost_envelope_stays_bounded_at_a_high_rate() -> None:
    envelope = CostEnvelope(RouteWiseParams(envelope_window_hours=1.0))
    for i in range(100_000):  # ~28 requests a second for an hour
        envelope.add(0.001 + (i % 100) * 1e-5, i * 0.036)
    assert len(envelope) <= ENVELOPE_MAX_SAMPLES * 1.05 + 1
    low, high = envelope.bounds(100_000 * 0.036) or (0.0, 0.0)
    assert low == pytest.approx(0.0011, rel=0.05)  # the 10th and 90th percentiles survive
    assert high == pytest.approx(0.0019, rel=0.05)


def test_the_failures_of_a_route_left_idle_for_a_minute_are_forgotten() -> None:
    evidence = LatencyEvidence(RouteWiseParams(latency_fast_half_life_sec=0.0))  # idle: 60 s
    for i in range(60):
        evidence.success("a", 50.0, float(i))
    evidence.failure("a", "connect", 60.0)  # the route went down

    # (60 * 50 + 60,000) / 61: the LP moves off
    assert (evidence.estimate("a", 61.0) or 0.0) > 900.0
    assert (evidence.estimate("a", 119.5) or 0.0) > 900.0  # idle, but not for long enough yet
    # A minute on, nothing sent there since: its successes price it again, so the LP tries
    # it (a recovered route is back). With the failure weighing the whole 15-minute window,
    # nothing would ever be sent there again.
    assert evidence.estimate("a", 120.5) == pytest.approx(50.0)
    evidence.failure("a", "connect", 121.0)  # still down: the LP moves off again
    assert (evidence.estimate("a", 121.5) or 0.0) > 900.0
    # The failure before the idle spell stays forgotten; a route that keeps its traffic
    # keeps its failures' whole weight.
    evidence.success("a", 50.0, 130.0)
    assert evidence.estimate("a", 131.0) == pytest.approx((61 * 50 + 60_000) / 62)
