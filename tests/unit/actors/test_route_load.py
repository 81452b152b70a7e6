"""RouteLoad (actors/state/route_load.py): in-flight counts per route that heal by
themselves, and the AIMD learned limit (cut by 429s and by TTFT inflation, raised by
successes). Times are plain numbers on an injected clock: nothing waits."""

from __future__ import annotations

import pytest

from actors.state.learned_limit import LearnedLimit
from actors.state.route_load import RouteLoad


def load(**caps: int | None) -> RouteLoad:
    return RouteLoad(caps or {"a": None, "b": None, "c": None}, ttl=60.0, min_limit=2.0)


def idle(lim: LearnedLimit, ms: float, now: float = 0.0) -> None:
    """The handful of unloaded answers a baseline needs before it judges any."""
    for i in range(5):
        lim.succeeded(ms, at_send=0, now=now + i / 100)


# -- in flight --------------------------------------------------------------------------------


def test_a_plans_primary_counts_until_its_attempt_ends_however_it_ends() -> None:
    rl = load()
    for rid in ("r1", "r2", "r3"):
        rl.issued(rid, ("a", "b"), 0.0)

    assert rl.in_flight("a") == 3
    rl.observed("r1", "a", "success", 1.0)
    rl.observed("r2", "a", "cancelled", 1.0)  # the client went away
    rl.observed("r3", "a", "client_error", 1.0)
    assert (rl.in_flight("a"), rl.in_flight("b")) == (0, 0)


def test_a_failure_moves_the_count_to_the_next_candidate_and_its_end_releases_it() -> None:
    rl = load()
    rl.issued("r", ("a", "b", "c"), 0.0)

    assert rl.observed("r", "a", "failure", 1.0) == (0, True)
    assert (rl.in_flight("a"), rl.in_flight("b")) == (0, 1)
    # b was skipped by the ingress (its lease refused): c's observation finds the count.
    assert rl.observed("r", "c", "success", 2.0) == (0, False)
    assert [rl.in_flight(e) for e in "abc"] == [0, 0, 0]


def test_the_last_candidates_failure_ends_the_count() -> None:
    rl = load()
    rl.issued("r", ("a",), 0.0)
    rl.observed("r", "a", "failure", 1.0)

    assert rl.in_flight("a") == 0


def test_a_failure_of_an_attempt_already_relayed_ends_the_count_where_it_is() -> None:
    # A stream that broke after its first chunk reached the client is sent nowhere else.
    rl = load()
    rl.issued("r", ("a", "b", "c"), 0.0)

    assert rl.observed("r", "a", "failure", 1.0, committed=True) == (0, False)
    assert [rl.in_flight(e) for e in "abc"] == [0, 0, 0]


def test_an_unsent_candidate_moves_the_count_to_the_next_and_the_last_ends_it() -> None:
    # The ingress goes on to the next candidate of a plan whose candidate it never sent (its
    # pool had no lease, the caller's limits refused the plan: then each is given back).
    rl = load()
    rl.issued("r1", ("a", "b"), 0.0)
    rl.issued("r2", ("a", "b"), 0.0)
    rl.unsent("r1", "a")

    assert (rl.in_flight("a"), rl.in_flight("b")) == (1, 1)
    rl.unsent("r1", "b")
    assert (rl.in_flight("a"), rl.in_flight("b")) == (1, 0)
    assert rl.observed("r2", "c", "success", 1.0) == (-1, False)  # not of this plan


def test_a_fallback_sent_after_one_given_back_is_counted_and_its_answer_judged() -> None:
    # Before, giving back b ended the request's count: c ran uncounted and its answer was
    # not one the learned limit could judge (-1: sent with how many others unknown).
    rl = load()
    rl.issued("r", ("a", "b", "c"), 0.0)
    rl.issued("other", ("c",), 0.0)
    rl.observed("r", "a", "failure", 1.0)
    rl.unsent("r", "b")  # b's pool had no lease for it

    assert [rl.in_flight(e) for e in "abc"] == [0, 0, 2]
    assert rl.observed("r", "c", "success", 2.0) == (1, False)
    assert [rl.in_flight(e) for e in "abc"] == [0, 0, 1]


def test_an_answer_from_a_route_the_count_moved_past_ends_it() -> None:
    rl = load()
    rl.issued("key", ("a", "b"), 0.0)
    rl.observed("key", "a", "failure", 1.0)  # a refused key: retried on a's next key

    assert rl.observed("key", "a", "success", 2.0) == (-1, False)
    assert [rl.in_flight(e) for e in "abc"] == [0, 0, 0]


def test_a_hedges_backup_failing_beside_its_primary_leaves_the_primary_counted() -> None:
    # Before, the backup's failure moved the count from a (still running) past b to c, a
    # request c never got, and a's answer was not judged.
    rl = load()
    rl.issued("h", ("a", "b", "c"), 0.0, hedge="b")
    rl.observed("h", "b", "failure", 1.0)

    assert [rl.in_flight(e) for e in "abc"] == [1, 0, 0]
    assert rl.observed("h", "a", "failure", 2.0) == (0, True)  # on to c, past the backup
    assert [rl.in_flight(e) for e in "abc"] == [0, 0, 1]


def test_a_hedges_backup_cancelled_by_the_primarys_answer_leaves_the_primary_judged() -> None:
    rl = load()
    rl.issued("h", ("a", "b", "c"), 0.0, hedge="b")
    rl.observed("h", "b", "cancelled", 1.0)

    assert rl.in_flight("a") == 1
    assert rl.observed("h", "a", "success", 2.0) == (0, False)
    assert [rl.in_flight(e) for e in "abc"] == [0, 0, 0]


def test_a_hedges_backup_failing_then_answering_on_its_spare_key_ends_the_request() -> None:
    # The ingress retries a backup refused for its key on the next key while the primary's
    # failure moves the count on: the backup's answer then ends it (before, c kept a count).
    rl = load()
    rl.issued("h", ("a", "b", "c"), 0.0, hedge="b")
    rl.observed("h", "b", "failure", 1.0)
    rl.observed("h", "a", "failure", 1.0)

    assert rl.observed("h", "b", "success", 2.0) == (-1, False)
    assert [rl.in_flight(e) for e in "abc"] == [0, 0, 0]


def test_a_streamed_hedge_won_by_its_backup_counts_the_backup_until_it_ends() -> None:
    # A stream's race is decided at its first token: the primary is observed declined then,
    # the backup only once its stream ends (before, the count ended with the primary's).
    rl = load()
    rl.issued("h", ("a", "b", "c"), 0.0, hedge="b")

    assert rl.observed("h", "a", "cancelled", 1.0, lost_race=True) == (-1, False)
    assert [rl.in_flight(e) for e in "abc"] == [0, 1, 0]
    assert rl.observed("h", "b", "success", 5.0) == (0, False)
    assert [rl.in_flight(e) for e in "abc"] == [0, 0, 0]


def test_a_hedges_primary_cancelled_by_its_client_ends_the_request() -> None:
    rl = load()
    rl.issued("h", ("a", "b", "c"), 0.0, hedge="b")
    rl.observed("h", "a", "cancelled", 1.0)

    assert [rl.in_flight(e) for e in "abc"] == [0, 0, 0]


def test_a_hedges_backup_answering_first_ends_the_request() -> None:
    rl = load()
    rl.issued("h", ("a", "b", "c"), 0.0, hedge="b")

    assert rl.observed("h", "b", "success", 1.0) == (-1, False)
    assert [rl.in_flight(e) for e in "abc"] == [0, 0, 0]
    assert rl.observed("h", "a", "cancelled", 1.0) == (-1, False)  # the primary, cancelled


def test_counts_whose_observation_never_comes_expire_after_the_ttl() -> None:
    rl = load()
    rl.issued("lost", ("a",), 0.0)
    rl.issued("live", ("a",), 30.0)

    assert rl.expire(59.0) == 0
    assert rl.expire(60.0) == 1
    assert rl.in_flight("a") == 1
    rl.issued("next", ("a",), 100.0)  # issuing sweeps too
    assert rl.in_flight("a") == 1


def test_an_observation_of_an_unknown_request_changes_nothing() -> None:
    rl = load()

    assert rl.observed("nobody", "a", "success", 0.0) == (-1, False)
    assert rl.in_flight("a") == 0


# -- the learned limit ------------------------------------------------------------------------


def test_no_limit_until_congestion_then_a_429_halves_from_the_concurrency_it_refused_at() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0)

    assert lim.admits(15) and lim.effective() is None
    assert lim.rate_limited(at_send=9, now=0.0)
    assert lim.limit == pytest.approx(5.0) and lim.reason == "rate_limited"
    assert not lim.admits(5) and lim.admits(4)


def test_one_burst_of_429s_cuts_once_and_a_later_one_cuts_again_never_under_the_floor() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0)
    lim.rate_limited(9, 0.0)

    assert not lim.rate_limited(9, 0.5)  # the same burst
    assert lim.rate_limited(4, 1.0)
    assert lim.limit == pytest.approx(2.5)
    lim.rate_limited(1, 2.0)
    assert lim.limit == pytest.approx(2.0)


def test_after_a_429_calm_successes_at_the_limit_raise_it_by_one_over_the_limit_to_the_cap() -> (
    None
):
    lim = LearnedLimit(cap=5, min_limit=2.0)
    lim.rate_limited(7, 0.0)  # 4
    grown = [lim.succeeded(100.0, at_send=3, now=1.0 + i) for i in range(8)]

    assert grown[:4] == [True] * 4  # 4 + 1/4, + 1/4.25, ...
    assert grown[-1] is False and lim.limit == pytest.approx(5.0)  # capped at 5
    assert lim.effective() == 5.0


def test_after_a_delay_cut_each_calm_answer_at_the_limit_raises_it_by_one() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0)
    idle(lim, 100.0)  # the baseline: 100 ms
    for i in range(3):
        lim.succeeded(1000.0, at_send=20, now=10.0 + i / 10)  # queued: cut to 10
    assert lim.limit == pytest.approx(10.0)
    # Before: a tenth of a slot per answer, ten seconds of four-second answers to regain one.
    for i in range(5):
        full = int(lim.limit or 0) - 1  # the route kept full
        lim.succeeded(110.0, at_send=full, now=12.0 + i)
    assert lim.limit == pytest.approx(15.0) and lim.reason == "grew"


def test_answers_slower_than_calm_but_not_queued_enough_to_cut_stop_the_growth() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0)
    idle(lim, 100.0)
    for i in range(3):
        lim.succeeded(1000.0, at_send=20, now=10.0 + i / 10)  # 10
    # 180 ms: under the cut's 200 ms, but over half again the baseline: a slot or two
    # queued past the knee. Neither cut nor grown.
    changed = [lim.succeeded(180.0, at_send=9, now=12.0 + i) for i in range(5)]

    assert changed == [False] * 5 and lim.limit == pytest.approx(10.0)


def test_successes_far_under_the_limit_do_not_raise_it() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0)
    lim.rate_limited(19, 0.0)  # 10

    assert not lim.succeeded(100.0, at_send=2, now=1.0)
    assert lim.limit == pytest.approx(10.0)


def test_ttft_inflating_over_the_unloaded_baseline_cuts_from_the_concurrency_it_was_sent_at() -> (
    None
):
    lim = LearnedLimit(cap=None, min_limit=2.0, inflation=2.0)
    idle(lim, 100.0)  # the baseline
    changed = [lim.succeeded(1000.0, at_send=8, now=10.0 + i / 4) for i in range(5)]

    assert lim.baseline_ms == pytest.approx(100.0)
    # Three inflated answers in a row cut; then one cut a second. Ten times the baseline
    # is a deep queue: the gradient halves (its steepest cut) from the 8 it was sent with.
    assert changed == [False, False, True, False, False]
    assert lim.limit == pytest.approx(4.0) and lim.reason == "ttft_inflated"


def test_a_mild_inflation_cuts_by_the_gradient_from_where_it_was_sent() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0, inflation=2.0)
    idle(lim, 100.0)
    for i in range(8):
        lim.succeeded(230.0, at_send=10, now=1.0 + i / 10)

    assert lim.reason == "ttft_inflated"
    assert lim.limit == pytest.approx(10 * 200 / 230)  # 200 over 230: under a seventh off


def test_a_queue_for_long_held_slots_cuts_to_the_slots_it_shows_not_by_the_ttft_ratio() -> None:
    # Twenty slots, each held 3 s by a streamed answer whose first token comes in 200 ms:
    # sent with 24 in flight, an answer waits for 5 of 3 s / 20 slots = 750 ms, nearly five
    # times its baseline. Before: the TTFT's ratio halved the limit (12 of the 20 the
    # provider serves), and the cheap route's traffic went to dearer ones.
    lim = LearnedLimit(cap=None, min_limit=2.0, inflation=2.0)
    for i in range(5):
        lim.succeeded(200.0, at_send=0, now=i / 100, held_ms=3000.0)
    for i in range(3):
        lim.succeeded(950.0, at_send=24, now=10.0 + i / 10, held_ms=3750.0)

    assert lim.hold_ms == pytest.approx(3000.0)  # queued answers do not lengthen the hold
    assert lim.reason == "ttft_inflated"
    assert lim.limit == pytest.approx(20.0)


def test_a_queue_read_as_slots_still_cuts_at_least_a_tenth_and_at_most_half() -> None:
    shallow, deep = (LearnedLimit(cap=None, min_limit=2.0) for _ in range(2))
    for lim, ms in ((shallow, 420.0), (deep, 9000.0)):
        for i in range(5):
            lim.succeeded(200.0, at_send=0, now=i / 100, held_ms=3000.0)
        for i in range(3):
            lim.succeeded(ms, at_send=20, now=10.0 + i / 10, held_ms=3000.0)

    assert shallow.limit == pytest.approx(18.0) and deep.limit == pytest.approx(10.0)


def test_an_unmeasured_route_takes_half_again_what_it_answered_calmly() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0)

    assert lim.admits(15) and not lim.admits(16)  # slow start: nothing answered yet
    assert lim.bound() == 16.0  # what RouteWise prices its queueing against
    idle(lim, 100.0)
    lim.succeeded(110.0, at_send=19, now=1.0)  # twenty in flight, answered calmly
    assert lim.admits(29) and not lim.admits(30) and lim.effective() is None
    # Slower, though not queued enough to cut: no growth (before: doubled to 62).
    lim.succeeded(190.0, at_send=30, now=2.0)
    assert lim.bound() == 30.0


def test_a_route_alone_queueing_cuts_against_its_own_baseline() -> None:
    rl = load()
    idle(rl.limits["a"], 100.0)  # no other route ever answers
    cut = [rl.succeeded("a", 2000.0, at_send=30, now=1.0 + i / 10) for i in range(3)]

    assert cut == [False, False, True] and rl.limits["a"].limit == pytest.approx(15.0)


def test_answers_sent_before_the_last_cut_do_not_cut_again() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0)
    idle(lim, 100.0)
    for i in range(3):
        lim.succeeded(2000.0, at_send=30, now=1.0 + i / 10)  # cut to 15
    # The queue they were sent into drains for seconds: its answers are still slow.
    later = [lim.succeeded(2000.0, at_send=30, now=3.0 + i) for i in range(5)]

    assert later == [False] * 5 and lim.limit == pytest.approx(15.0)
    # Sent under the new limit and still queued: cut again, from where they were sent.
    assert [lim.succeeded(2000.0, at_send=12, now=9.0 + i / 10) for i in range(3)] == [
        False,
        False,
        True,
    ]
    assert lim.limit == pytest.approx(6.0)


def test_a_slow_answer_alone_is_no_queue() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0)
    idle(lim, 100.0)

    assert not lim.succeeded(5000.0, at_send=1, now=1.0)  # sent with one other in flight
    assert lim.limit is None


def test_the_baseline_follows_a_provider_that_became_slower_for_good_slowly() -> None:
    lim = LearnedLimit(cap=None)
    idle(lim, 100.0)
    for i in range(100):
        lim.succeeded(300.0, at_send=0, now=1.0 + i)

    assert lim.baseline_ms is not None and 200.0 < lim.baseline_ms < 300.0


def test_saturated_is_the_learned_limit_against_the_count() -> None:
    rl = load()
    rl.limits["a"].rate_limited(3, 0.0)  # 2
    rl.issued("r1", ("a",), 1.0)

    assert not rl.saturated("a")
    rl.issued("r2", ("a",), 1.0)
    assert rl.saturated("a") and not rl.saturated("b")


def test_a_provider_limit_said_spent_saturates_the_route_until_its_reset() -> None:
    rl = load()
    rl.spent("a", until=11.0)

    assert rl.saturated("a", now=10.0) and not rl.saturated("b", now=10.0)
    assert not rl.saturated("a", now=11.0)  # the reset: back in rotation at once


def test_an_inflation_every_route_shares_is_not_one_routes_queue() -> None:
    rl = load()
    for e in "abc":
        idle(rl.limits[e], 10.0)  # the baselines
    # The gateway itself is slow: every route's answers take ten times as long.
    for e in "bc":
        for i in range(5):
            rl.succeeded(e, 100.0, at_send=0, now=1.0 + i)
    for i in range(5):
        rl.succeeded("a", 100.0, at_send=4, now=10.0 + i)
    shared = (rl.limits["a"].reason, rl.limits["a"].limit)
    own = [rl.succeeded("a", 3000.0, at_send=4, now=20.0 + i / 10) for i in range(3)]

    assert shared == ("", None)  # nothing cut for the shared delay
    assert own == [False, False, True]  # a alone is far slower still: its queue
    assert rl.limits["a"].reason == "ttft_inflated"


def test_the_baseline_is_the_mean_of_unqueued_answers_not_the_luckiest_one() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0)
    lim.succeeded(40.0, at_send=0, now=0.0)  # one lucky answer
    for i in range(9):
        lim.succeeded(100.0, at_send=i % 7, now=1.0 + i)  # under half the slow start

    # Before: the lowest (40 ms), so every ordinary answer over 140 ms looked queued.
    assert lim.baseline_ms == pytest.approx(94.0)


def test_answers_sent_under_the_knee_once_the_queue_drained_do_not_cut_again() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0)
    idle(lim, 100.0)
    for i in range(3):
        lim.succeeded(2000.0, at_send=30, now=1.0 + i / 10)  # cut to 15
    # Sent with twelve others, under the knee: no queue, whatever the last answers said.
    after = [lim.succeeded(110.0, at_send=12, now=3.0 + i / 10) for i in range(3)]

    # Before: a moving mean still far over the ceiling cut these to 6.
    assert after == [False] * 3 and lim.limit == pytest.approx(15.0)


def test_a_cut_starts_from_the_median_concurrency_the_queued_answers_were_sent_with() -> None:
    lim = LearnedLimit(cap=None, min_limit=2.0)
    idle(lim, 100.0)
    lim.succeeded(1000.0, at_send=30, now=1.0)
    lim.succeeded(1000.0, at_send=29, now=1.1)
    lim.succeeded(1000.0, at_send=5, now=1.2)  # a long prompt, sent low by chance

    # Before: from the last one's 5, to the floor of 2.
    assert lim.limit == pytest.approx(14.5) and lim.reason == "ttft_inflated"


def test_one_other_route_queueing_does_not_hide_this_routes_queue() -> None:
    rl = load()
    for e in "abc":
        idle(rl.limits[e], 10.0)  # the baselines
    for i in range(5):
        rl.succeeded("b", 100.0, at_send=8, now=1.0 + i)  # b queues
        rl.succeeded("c", 10.0, at_send=8, now=1.0 + i)  # c does not: no shared delay
    cut = [rl.succeeded("a", 500.0, at_send=8, now=10.0 + i / 10) for i in range(3)]

    # Before: the others' median inflation (b's and c's, 5.5 times) raised the ceiling over
    # a's queue.
    assert cut == [False, False, True] and rl.limits["a"].reason == "ttft_inflated"


def test_a_failure_does_not_move_the_count_to_a_candidate_already_given_back() -> None:
    rl = load()
    rl.issued("h", ("a", "b", "c"), 0.0)
    rl.unsent("h", "b")  # the hedge's backup, refused by its pool while a runs
    rl.observed("h", "a", "failure", 1.0)  # the loop goes on to c

    assert (rl.in_flight("a"), rl.in_flight("b"), rl.in_flight("c")) == (0, 0, 1)
