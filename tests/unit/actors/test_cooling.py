"""Cooling (actors/state/cooling.py): a 429 rests a credential for what the provider asked,
else for a backoff doubling while 429s continue; times are on an injected clock (plain
numbers), so nothing waits."""

from __future__ import annotations

import pytest

from actors.state.cooling import Cooling
from actors.state.keypool import KeyPool
from schemas.config import KeyPoolConfig


def test_cooling_for_the_providers_retry_after() -> None:
    c = Cooling(initial=1.0, cap=60.0)

    assert c.rate_limited("k", 100.0, 7.5) == pytest.approx(107.5)
    assert c.until("k", 107.0) == pytest.approx(107.5)
    assert c.until("k", 107.5) is None


def test_cooling_without_a_hint_doubles_while_429s_continue_up_to_the_cap() -> None:
    c = Cooling(initial=1.0, cap=5.0)
    now, lengths = 0.0, []
    for _ in range(5):
        until = c.rate_limited("k", now, None)
        assert until is not None
        lengths.append(until - now)
        now = until  # the next 429 comes as soon as the key is back

    assert lengths == [1.0, 2.0, 4.0, 5.0, 5.0]


@pytest.mark.parametrize("hint", [0.0, -5.0])
def test_cooling_a_429_that_asks_for_no_wait_rests_the_key_as_one_without_a_hint(
    hint: float,
) -> None:
    # Taken at its word, "come back in 0 s" lets the request that met it send the refused
    # request again at once, up to its attempt cap (20 upstream calls in 16 ms, measured).
    c = Cooling(initial=1.0, cap=60.0)

    assert c.rate_limited("k", 10.0, hint) == pytest.approx(11.0)
    assert c.rate_limited("k", 11.0, hint) == pytest.approx(13.0)  # and doubles as one does


def test_cooling_the_echoes_of_one_burst_neither_double_nor_extend_it() -> None:
    c = Cooling(initial=1.0, cap=60.0)
    first = c.rate_limited("k", 10.0, None)
    echoes = [c.rate_limited("k", 10.0 + i / 10, None) for i in range(1, 5)]
    later = c.rate_limited("k", 11.0, None)

    assert first == pytest.approx(11.0)
    assert echoes == [None] * 4  # answers of requests already in flight: one signal
    assert later == pytest.approx(13.0)  # the next 429 after it ended: 2 s


def test_cooling_a_success_resets_the_backoff_but_keeps_a_running_cooling() -> None:
    c = Cooling(initial=1.0, cap=60.0)
    c.rate_limited("k", 0.0, None)
    c.rate_limited("k", 1.0, None)  # 2 s
    c.succeeded("k")

    assert c.until("k", 2.5) == pytest.approx(3.0)
    assert c.rate_limited("k", 3.0, None) == pytest.approx(4.0)  # back to 1 s


def test_cooling_never_shortens_a_running_one() -> None:
    c = Cooling(initial=1.0, cap=60.0)
    c.rate_limited("k", 0.0, 30.0)

    assert c.rate_limited("k", 1.0, 1.0) is None
    assert c.until("k", 29.0) == pytest.approx(30.0)


def test_cooling_merge_takes_the_owners_later_ends_only() -> None:
    c = Cooling()
    c.rate_limited("a", 0.0, 10.0)
    c.merge({"a": 5.0, "b": 8.0})

    assert c.live(1.0) == {"a": 10.0, "b": 8.0}


def test_keypool_picks_around_a_cooling_key_and_a_route_all_cooling_says_until_when() -> None:
    pool = KeyPool("m:a", KeyPoolConfig(), [("k1", "free"), ("k2", "free")])
    pool.rate_limited("k1", 0.0, 10.0)

    assert pool.peek("caller", "free", 1.0) == "k2"
    assert pool.cooling_until("free", 1.0) is None  # k2 still serves
    pool.rate_limited("k2", 1.0, 4.0)
    assert pool.cooling_until("free", 2.0) == pytest.approx(5.0)  # the first key back
    assert pool.mutes(2.0) == {}  # cooling is no mute


def test_keypool_a_route_without_keys_cools_as_one_credential() -> None:
    pool = KeyPool("m:a", KeyPoolConfig(cooling_seconds=2.0))
    pool.rate_limited("", 0.0, None)

    assert pool.cooling_until(None, 1.0) == pytest.approx(2.0)
    assert pool.cooling_until(None, 2.0) is None


def test_keypool_a_route_with_muted_and_cooling_keys_is_cooling_not_refused() -> None:
    pool = KeyPool("m:a", KeyPoolConfig(), [("k1", "free"), ("k2", "free")])
    pool.record("k1", status=500, outcome="failure", role="free", now=0.0)
    pool.rate_limited("k2", 0.0, 3.0)

    assert pool.cooling_until("free", 1.0) == pytest.approx(3.0)
    assert pool.record("k2", status=429, outcome="failure", role="free", now=1.0) is not None
