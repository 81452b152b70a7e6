"""RatePace: a route's request rate limit, estimated from what its answers report and what was
sent since, spends the route while nothing of it is left."""

from __future__ import annotations

import math

import msgspec
import pytest

from actors.state.rate_pace import RatePace
from actors.state.route_load import RouteLoad
from schemas.routing import RateReport, RouteCandidate

NEVER = -math.inf


def keyed(endpoint: str, key: str) -> RouteCandidate:
    return RouteCandidate(endpoint=endpoint, kind="openai_compat", credential_id=key)


def report(limit: int, remaining: int, reset: float) -> RateReport:
    return RateReport(limit=limit, remaining=remaining, reset_seconds=reset)


def test_a_route_is_spent_once_the_requests_its_limit_has_left_are_sent() -> None:
    pace = RatePace()
    # 10 a second: 2 left once the reporting request was taken, all back in 0.8 s (8 used:
    # one comes back every 0.1 s). Its answer came 0.05 s after it was sent, nothing since.
    assert pace.reported(report(10, 2, 0.8), sent_at=0.0, sent_since=0, now=0.05) == NEVER
    assert pace.sent(0.05) == NEVER  # 2.5 left: 1.5
    until = pace.sent(0.05)  # 0.5 left: half a request comes back by 0.1
    assert until == pytest.approx(0.10)
    assert pace.sent(0.10) == pytest.approx(0.20)  # the one back at 0.1 is sent: 0 left


def test_what_was_sent_after_the_reporting_request_is_counted_against_its_report() -> None:
    pace = RatePace()
    # The answer says 3 were left, but 3 were sent after its request and before it came.
    until = pace.reported(report(4, 3, 1.0), sent_at=0.0, sent_since=3, now=0.0)
    assert until == pytest.approx(1.0)  # one request comes back a second


def test_the_estimate_refills_but_never_past_the_limit() -> None:
    pace = RatePace()
    pace.reported(report(5, 0, 1.0), sent_at=0.0, sent_since=0, now=0.0)  # 0.2 s a request
    for _ in range(4):  # an hour later the whole limit is back, and no more than it
        assert pace.sent(3600.0) == NEVER
    assert pace.sent(3600.0) == pytest.approx(3600.2)  # the fifth spends it


def test_a_full_allowance_says_nothing_of_the_refill_and_paces_nothing() -> None:
    pace = RatePace()
    assert pace.reported(report(3, 3, 0.0), sent_at=0.0, sent_since=5, now=0.0) == NEVER
    assert pace.sent(0.0) == NEVER


def test_route_load_paces_a_route_by_the_requests_sent_after_the_one_that_reported() -> None:
    load = RouteLoad({"a": None, "b": None}, ttl=600.0)
    load.issued("r0", ("a", "b"), 0.0)
    load.issued("r1", ("a", "b"), 0.01)
    # r0's answer: a limit of 4 a second, 2 left once r0 was taken (r1 came after it).
    load.reported("r0", "a", "", report(4, 2, 0.5), 0.02)  # 0.25 s a request: 1.08 left
    assert not load.saturated("a", 0.02)
    load.issued("r2", ("a", "b"), 0.02)  # 0.08 left
    assert load.saturated("a", 0.02) and not load.saturated("b", 0.02)
    assert not load.saturated("a", 0.26)  # the next one is back by 0.25


def test_a_spent_limit_an_answer_said_outlasts_a_pace_that_frees_sooner() -> None:
    load = RouteLoad({"a": None}, ttl=600.0)
    load.spent("a", 5.0)  # the token limit is spent for 5 s
    load.issued("r0", ("a",), 0.0)
    load.reported("r0", "a", "", report(100, 99, 1.0), 0.0)  # the request limit is not
    assert load.saturated("a", 4.9) and not load.saturated("a", 5.0)


def test_a_plan_never_sent_gives_its_request_back_and_is_not_counted_after_a_report() -> None:
    load = RouteLoad({"a": None}, ttl=600.0)
    load.issued("r0", ("a",), 0.0)
    load.reported("r0", "a", "", report(4, 1, 1.0), 0.0)  # 1 left, one back every 1/3 s
    load.issued("r1", ("a",), 0.0)
    assert load.saturated("a", 0.0)
    load.unsent("r1", "a", 0.0)  # its caller's limits refused it after routing
    assert not load.saturated("a", 0.0)
    load.issued("r2", ("a",), 0.0)
    # r0's answer again (a later report of it): only r2 was sent after r0, not r1.
    load.reported("r0", "a", "", report(4, 2, 1.0), 0.0)
    assert not load.saturated("a", 0.0)


def test_a_plan_never_sent_gives_nothing_back_after_a_later_requests_report() -> None:
    # r1's report reads what the provider had left, which never counted r0 (never sent):
    # before, giving r0 back then counted its request twice (2 left where 1 is).
    load = RouteLoad({"a": None}, ttl=600.0)
    load.issued("r0", ("a",), 0.0)
    load.issued("r1", ("a",), 0.0)
    load.reported("r1", "a", "", report(4, 1, 1.0), 0.0)  # 1 left once r1 was taken
    load.unsent("r0", "a", 0.0)  # r0's lease was refused after routing
    load.issued("r2", ("a",), 0.0)
    assert load.saturated("a", 0.0)


def test_a_fallbacks_report_counts_the_refill_since_it_was_moved_there() -> None:
    load = RouteLoad({"a": None, "b": None}, ttl=600.0)
    load.issued("r0", ("a", "b"), 0.0)
    load.observed("r0", "a", "failure", 10.0)  # moved to b at 10 s
    # b's answer comes at the end of a 10 s stream: none left when b took it, one back a
    # second since, so ten are back by now.
    load.reported("r0", "b", "", report(10, 0, 10.0), 20.0)
    assert not load.saturated("b", 20.0)


def test_a_report_of_a_request_not_counted_on_its_route_counts_all_in_flight_after_it() -> None:
    load = RouteLoad({"a": None}, ttl=600.0)
    load.issued("r0", ("a",), 0.0)
    load.issued("r1", ("a",), 0.0)
    load.reported("gone", "a", "", report(4, 2, 1.0), 0.0)  # its flight expired: both after it
    assert load.saturated("a", 0.0)


def test_a_clock_stepped_back_refills_nothing_and_takes_nothing() -> None:
    pace = RatePace()
    pace.reported(report(10, 5, 5.0), sent_at=100.0, sent_since=0, now=100.0)  # 1 s each
    assert pace.sent(40.0) == NEVER  # 60 s back: 4 left, not -56


def test_a_reset_already_past_keeps_the_refill_known() -> None:
    pace = RatePace()
    pace.reported(report(4, 2, 1.0), sent_at=0.0, sent_since=0, now=0.0)  # 0.5 s each
    # A provider clock behind this one: its reset reads as past, which says no refill.
    until = pace.reported(report(4, 0, 0.0), sent_at=1.0, sent_since=0, now=1.0)
    assert until == pytest.approx(1.5)


def test_a_route_of_several_keys_is_spent_only_once_every_key_is() -> None:
    keys: dict[str, tuple[str, ...]] = {"a": ("k1", "k2")}
    load = RouteLoad({"a": None}, ttl=600.0, keys_of=lambda e: keys.get(e, ()))
    load.issued("r0", ("a",), 0.0, (keyed("a", "k1"),))
    load.issued("r1", ("a",), 0.0, (keyed("a", "k2"),))
    load.reported("r0", "a", "k1", report(2, 0, 20.0), 0.0)  # k1 has none left
    assert not load.saturated("a", 0.0)  # k2 is metered apart
    load.reported("r1", "a", "k2", report(2, 1, 20.0), 0.0)  # k2 has one left
    load.issued("r2", ("a",), 0.0, (keyed("a", "k2"),))  # which this takes
    assert load.saturated("a", 0.0)
    assert not load.saturated("a", 10.0)  # a request of each is back at 10 s
    keys["a"] = ("k1", "k2", "k3")  # an operator adds a key: it has not said it is spent
    load.paces.refresh("a")  # the ModelActor's answer to the pool's new state
    assert not load.saturated("a", 1.0)
    keys["a"] = ("k2",)  # k1 and k3 removed: k2 is back at 20 s, k1 no longer holds it open
    load.paces.refresh("a")
    assert load.saturated("a", 15.0) and not load.saturated("a", 20.0)


def test_a_report_not_counted_on_its_key_counts_only_that_keys_requests_in_flight() -> None:
    keys = {"a": ("k1", "k2")}
    load = RouteLoad({"a": None}, ttl=600.0, keys_of=lambda e: keys.get(e, ()))
    for i in range(5):
        load.issued(f"r{i}", ("a",), 0.0, (keyed("a", "k1"),))
    load.issued("r9", ("a",), 0.0, (keyed("a", "k2"),))
    # A report on k2 of a request not counted there (retried there on a spare key): the one
    # request in flight on k2 may have been sent after it, not the five on k1.
    load.reported("spare", "a", "k2", report(10, 2, 8.0), 0.0)
    load.reported("r0", "a", "k1", report(10, 0, 10.0), 0.0)  # k1: none left
    assert not load.saturated("a", 0.0)  # k2 has one left


def tokens(limit: int, remaining: int, reset: float, of: RateReport) -> RateReport:
    """``of`` (a request limit's report) with a token limit's."""
    token_limit = RateReport(limit=limit, remaining=remaining, reset_seconds=reset)
    return RateReport(
        limit=of.limit, remaining=of.remaining, reset_seconds=of.reset_seconds, tokens=token_limit
    )


def test_a_request_fits_a_token_limit_once_what_it_takes_is_left() -> None:
    pace = RatePace()
    # 10,000 a second: 2,500 left once the reporting request was taken (7,500 used: one token
    # back every 1/7,500 s).
    assert pace.reported(report(10_000, 2_500, 1.0), sent_at=0.0, sent_since=0, now=0.0) == NEVER
    assert pace.sent(0.0, 1_000.0) == NEVER  # 1,500 left
    assert pace.room_at(1_500.0, 0.0) == NEVER
    assert pace.room_at(2_000.0, 0.0) == pytest.approx(500 / 7_500)  # 500 more by 1/15 s
    # A request larger than the whole limit waits for all of it, not for ever.
    assert pace.room_at(50_000.0, 0.0) == pytest.approx(8_500 / 7_500)
    assert pace.sent(0.0, 1_500.0) == pytest.approx(1 / 7_500)  # none left: spent


def test_a_route_is_paced_by_its_token_limit_while_requests_are_left() -> None:
    load = RouteLoad({"a": None, "b": None}, ttl=600.0)
    paces = load.paces
    paces.answered(400)  # answers take 400 tokens on average
    assert paces.tokens("a", 600) == (600.0, 400.0)
    load.issued("r0", ("a", "b"), 0.0, asked=(600, None, 0))
    load.issued("r1", ("a", "b"), 0.0, asked=(2_600, None, 0))  # 3,000 tokens
    assert not paces.tokens_paced and paces.room_at("a", (1e9, 0.0), 0.0) == NEVER
    # r0's answer: 99 requests left, but 4,500 tokens of 10,000 (a token back every 0.1 ms),
    # and r1, sent after r0, took 3,000 of them: 1,500 left.
    plenty = report(100, 99, 1.0)
    load.reported("r0", "a", "", tokens(10_000, 4_500, 0.55, plenty), 0.0)
    assert paces.tokens_paced
    assert paces.room_at("a", (1_500.0, 0.0), 0.0) == NEVER
    assert paces.room_at("a", (2_000.0, 0.0), 0.0) == pytest.approx(0.05)  # 500 more in 0.05 s
    assert paces.room_at("b", (2_000.0, 0.0), 0.0) == NEVER  # b reported no token limit
    load.issued("r2", ("a", "b"), 0.0, asked=(1_000, 0, 0))  # 500 left
    assert paces.room_at("a", (1_000.0, 0.0), 0.0) == pytest.approx(0.05)
    load.unsent("r2", "a", 0.0)  # a plan never sent gives its tokens back
    assert paces.room_at("a", (1_500.0, 0.0), 0.0) == NEVER
    # r0's answer read again: only r1's 3,000 tokens count after it (not r2's, never sent).
    load.reported("r0", "a", "", tokens(10_000, 4_100, 0.59, plenty), 0.0)
    assert paces.room_at("a", (1_100.0, 0.0), 0.0) == NEVER
    assert paces.room_at("a", (1_101.0, 0.0), 0.0) > 0.0
    assert not load.saturated("a", 0.0)  # tokens left: no request is refused by the route
    load.issued("r3", ("a", "b"), 0.0, asked=(1_100, 0, 0))  # none left
    assert load.saturated("a", 0.0)


def test_a_request_with_max_tokens_takes_and_needs_its_cap_not_the_average_answer() -> None:
    paces = RouteLoad({"a": None}, ttl=600.0).paces
    paces.answered(400)  # answers take 400 tokens on average
    # Without a cap: the average to take, twice it of room; with one: the cap, which the
    # provider reserves while the answer runs, however short the answers have been.
    assert (paces.tokens("a", 600), paces.room_needed("a", 600)) == ((600.0, 400.0), (600.0, 800.0))
    assert paces.tokens("a", 600, 4_000) == paces.room_needed("a", 600, 4_000) == (600.0, 4_000.0)
    assert paces.tokens("a", 600, 100) == paces.room_needed("a", 600, 100) == (600.0, 100.0)


def test_an_output_limit_metered_apart_is_paced_by_the_output_its_requests_take() -> None:
    load = RouteLoad({"a": None}, ttl=600.0)
    paces = load.paces
    load.issued("r0", ("a",), 0.0, asked=(100, 50, 0))
    load.issued("r1", ("a",), 0.0, asked=(3_000, 400, 0))
    # r0's answer: input 9,000 of 10,000 left, output 1,000 of 2,000 (Anthropic's apart).
    output = RateReport(limit=2_000, remaining=1_000, reset_seconds=60.0)
    split = msgspec.structs.replace(tokens(10_000, 9_000, 60.0, report(100, 99, 1.0)),
                                    output_tokens=output)  # fmt: skip
    load.reported("r0", "a", "", split, 0.0)
    # r1, sent after r0, took 3,000 of the input and 400 of the output: 6,000 and 600 left.
    assert paces.room_at("a", (6_000.0, 600.0), 0.0) == NEVER
    assert paces.room_at("a", (6_000.0, 601.0), 0.0) > 0.0  # the output lacks one
    assert paces.room_at("a", (6_001.0, 10.0), 0.0) > 0.0  # the input lacks one
    # Together they had 6,600 left: a request of 100 and 1,000 fitted that, not the output.
    assert paces.room_at("a", (100.0, 1_000.0), 0.0) > 0.0
    load.issued("r2", ("a",), 0.0, asked=(5_000, 500, 0))
    assert paces.room_at("a", (1_000.0, 100.0), 0.0) == NEVER
    assert paces.room_at("a", (1_000.0, 101.0), 0.0) > 0.0
    load.unsent("r2", "a", 0.0)  # never sent: both given back
    assert paces.room_at("a", (6_000.0, 600.0), 0.0) == NEVER


def test_a_plan_never_sent_gives_back_to_the_paces_the_lane_has_now() -> None:
    load = RouteLoad({"a": None}, ttl=600.0)
    paces = load.paces
    combined = tokens(10_000, 5_000, 60.0, report(100, 99, 1.0))
    load.reported("first", "a", "", combined, 0.0)
    load.issued("r0", ("a",), 0.0, asked=(1_000, 2_000, 0))  # took 3,000 of the one pace
    # Then an answer reports input and output apart (not one counted here: r0 may follow).
    output = RateReport(limit=4_000, remaining=3_000, reset_seconds=60.0)
    apart = msgspec.structs.replace(tokens(10_000, 8_000, 60.0, report(100, 98, 1.0)),
                                    output_tokens=output)  # fmt: skip
    load.reported("other", "a", "", apart, 0.0)  # r0's 1,000 and 2,000 taken: 7,000 and 1,000
    load.unsent("r0", "a", 0.0)  # its prompt back to the input, the rest to the output
    assert paces.room_at("a", (8_000.0, 3_000.0), 0.0) == NEVER
    assert paces.room_at("a", (8_001.0, 10.0), 0.0) > 0.0
    assert paces.room_at("a", (10.0, 3_001.0), 0.0) > 0.0


def test_a_request_without_a_cap_takes_the_cap_its_route_is_sent_else_the_average() -> None:
    load = RouteLoad({"claude": None, "gpt": None}, ttl=600.0, default_caps={"claude": 4_096})
    paces = load.paces
    paces.answered(300)
    assert paces.tokens("claude", 600) == paces.room_needed("claude", 600) == (600.0, 4_096.0)
    assert (paces.tokens("gpt", 600), paces.room_needed("gpt", 600)) == ((600, 300), (600, 600))
    assert paces.tokens("claude", 600, 100) == (600.0, 100.0)  # the request's own cap first
    # A thinking budget asked without a cap is sent on top of Claude's default.
    assert paces.tokens("claude", 600, None, 2_048) == (600.0, 6_144.0)
    assert paces.room_needed("claude", 600, None, 2_048) == (600.0, 6_144.0)
    assert paces.tokens("gpt", 600, None, 2_048) == (600.0, 300.0)


def test_unpaced_the_token_limit_is_not_paced() -> None:
    load = RouteLoad({"a": None}, ttl=600.0, pacing=False)
    load.paces.answered(400)
    load.issued("r0", ("a",), 0.0, asked=(1_000, 0, 0))
    load.reported("r0", "a", "", tokens(10_000, 0, 1.0, report(100, 99, 1.0)), 0.0)
    assert not load.saturated("a", 0.0)
    assert not load.paces.tokens_paced and load.paces.room_at("a", (1_000.0, 0.0), 0.0) == NEVER


def test_requests_sent_past_a_spent_limit_are_owed_but_tokens_are_not() -> None:
    requests = RatePace()
    requests.reported(report(4, 0, 1.0), sent_at=0.0, sent_since=3, now=0.0)  # 0.25 s each
    tokens = RatePace(floor=0.0)
    tokens.reported(report(4_000, 0, 1.0), sent_at=0.0, sent_since=3_000, now=0.0)
    for _ in range(10):  # sent anyway (no route had room): the provider refuses them
        owed = requests.sent(0.0)
        not_owed = tokens.sent(0.0, 1_000.0)
    assert owed == pytest.approx((1 + 13) * 0.25)  # back once the 13 sent past it refilled
    assert not_owed == pytest.approx(0.25 / 1_000)  # a token back: a refused one took none
    assert tokens.room_at(1_000.0, 0.0) == pytest.approx(0.25)


def test_a_plan_never_sent_gives_back_only_the_tokens_it_took() -> None:
    load = RouteLoad({"a": None}, ttl=600.0)
    load.issued("r0", ("a",), 0.0, asked=(100, 0, 0))
    load.reported("r0", "a", "", tokens(10_000, 100, 99.0, report(100, 99, 1.0)), 0.0)
    load.issued("r1", ("a",), 0.0, asked=(5_000, 0, 0))  # takes the 100 left (a 429 at most)
    load.unsent("r1", "a", 0.0)  # and gives back those 100, not 5,000
    assert load.paces.room_at("a", (100.0, 0.0), 0.0) == NEVER
    assert load.paces.room_at("a", (101.0, 0.0), 0.0) > 0.0


def test_a_report_not_counted_on_its_route_counts_the_tokens_in_flight_after_it() -> None:
    load = RouteLoad({"a": None}, ttl=600.0)
    load.issued("r0", ("a",), 0.0, asked=(3_000, 0, 0))
    load.issued("r1", ("a",), 0.0, asked=(1_000, 0, 0))
    # Its flight expired: both may have been sent after it, 4,000 tokens of the 5,000 left.
    load.reported("gone", "a", "", tokens(10_000, 5_000, 5.0, report(100, 90, 1.0)), 0.0)
    assert load.paces.room_at("a", (1_000.0, 0.0), 0.0) == NEVER
    assert load.paces.room_at("a", (1_001.0, 0.0), 0.0) > 0.0
