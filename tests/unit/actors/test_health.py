"""EndpointHealth: the spec's breaker and EWMA, driven with explicit timestamps."""

from __future__ import annotations

import pytest

from actors.state.circuit import CLOSED, HALF_OPEN, OPEN, EndpointHealth
from schemas.config import CircuitConfig

SETTINGS = CircuitConfig(
    failure_threshold=3, cooldown_seconds=30, min_availability=0.7, ewma_alpha=0.1
)


def test_breaker_with_threshold_minus_one_failures_stays_closed() -> None:
    h = EndpointHealth(SETTINGS)
    for _ in range(2):
        assert h.record_failure(0.0, probe=False) is None
    assert h.state == CLOSED


def test_breaker_on_third_consecutive_failure_opens_for_cooldown() -> None:
    h = EndpointHealth(SETTINGS)
    h.record_failure(0.0, probe=False)
    h.record_failure(1.0, probe=False)
    t = h.record_failure(2.0, probe=False)
    assert t is not None and (t.old, t.new) == (CLOSED, OPEN)
    assert h.open_until == 32.0
    assert h.retry_after(12.0) == 20.0


def test_breaker_success_between_failures_resets_the_streak() -> None:
    h = EndpointHealth(SETTINGS)
    h.record_failure(0.0, probe=False)
    h.record_failure(0.0, probe=False)
    h.record_success(0.0, probe=False)
    h.record_failure(0.0, probe=False)
    assert h.state == CLOSED


def _opened() -> EndpointHealth:
    h = EndpointHealth(SETTINGS)
    for _ in range(3):
        h.record_failure(0.0, probe=False)
    return h


def test_breaker_before_cooldown_admits_no_probe() -> None:
    h = _opened()
    assert not h.try_acquire_probe(29.9, probe_timeout=30)
    assert h.state == OPEN


def test_breaker_after_cooldown_admits_exactly_one_probe() -> None:
    h = _opened()
    assert h.try_acquire_probe(30.0, probe_timeout=30)
    assert h.state == HALF_OPEN
    assert not h.try_acquire_probe(30.1, probe_timeout=30)


def test_breaker_probe_success_closes() -> None:
    h = _opened()
    h.try_acquire_probe(30.0, probe_timeout=30)
    t = h.record_success(31.0, probe=True)
    assert t is not None and t.new == CLOSED
    assert h.consecutive_failures == 0


def test_breaker_probe_failure_reopens_for_another_cooldown() -> None:
    h = _opened()
    h.try_acquire_probe(30.0, probe_timeout=30)
    t = h.record_failure(31.0, probe=True)
    assert t is not None and (t.old, t.new) == (HALF_OPEN, OPEN)
    assert h.open_until == 61.0


def test_breaker_hung_probe_reopens_at_its_deadline_and_a_new_probe_follows() -> None:
    h = _opened()
    h.try_acquire_probe(30.0, probe_timeout=30)
    t = h.tick(60.0)
    assert t is not None and t.new == OPEN and t.reason == "probe timed out"
    assert h.try_acquire_probe(90.0, probe_timeout=30)


def test_breaker_late_success_from_the_timed_out_probe_holder_closes() -> None:
    h = _opened()
    h.try_acquire_probe(30.0, probe_timeout=30, owner="r1")
    h.tick(60.0)  # the probe passed its deadline: open again
    assert h.record_success(61.0, probe=False, owner="someone-else") is None

    t = h.record_success(62.0, probe=False, owner="r1")

    assert t is not None and (t.old, t.new, t.reason) == (OPEN, CLOSED, "late probe succeeded")
    assert not h.is_late_probe("r1")


def test_breaker_late_success_closes_even_after_a_new_probe_was_granted() -> None:
    h = _opened()
    h.try_acquire_probe(30.0, probe_timeout=30, owner="r1")
    h.tick(60.0)
    assert h.try_acquire_probe(90.0, probe_timeout=30, owner="r2")

    t = h.record_success(91.0, probe=False, owner="r1")

    assert t is not None and (t.old, t.new) == (HALF_OPEN, CLOSED)
    assert not h.probe_in_flight  # r2's answer is an ordinary attempt now


def test_breaker_retry_after_while_a_long_probe_is_out_is_at_most_one_cooldown() -> None:
    h = _opened()
    h.try_acquire_probe(30.0, probe_timeout=600, owner="r1")
    assert h.retry_after(31.0) == 30.0


def test_breaker_abandoned_probe_reopens_without_counting_a_failure() -> None:
    h = _opened()
    h.try_acquire_probe(30.0, probe_timeout=30)
    failures = h.consecutive_failures
    t = h.record_abandoned_probe(31.0, "client went away")
    assert t is not None and t.new == OPEN
    assert h.consecutive_failures == failures


def test_ewma_from_full_availability_needs_four_failures_to_fall_under_floor() -> None:
    # The spec's own arithmetic: at alpha 0.1, 0.9^3 = 0.729 >= 0.7 and 0.9^4 = 0.6561 < 0.7.
    h = EndpointHealth(CircuitConfig(failure_threshold=100))
    for _ in range(3):
        h.record_failure(0.0, probe=False)
    assert h.healthy()
    h.record_failure(0.0, probe=False)
    assert not h.healthy()
    assert h.availability == pytest.approx(0.6561)


def test_auth_rejection_counts_from_the_first_and_resets_on_success() -> None:
    h = EndpointHealth(SETTINGS)
    h.record_failure(0.0, probe=False, auth=True)
    assert h.consecutive_auth_rejections == 1
    h.record_success(0.0, probe=False)
    assert h.consecutive_auth_rejections == 0
