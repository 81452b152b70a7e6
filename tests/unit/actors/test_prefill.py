"""PrefillLoad: leases, elephants, the caller's last-prompt hint."""

from __future__ import annotations

from actors.state.prefill import PrefillLoad


def _load() -> PrefillLoad:
    return PrefillLoad(elephant_tokens=1000, hint_ttl=60, lease_ttl=30)


def test_lease_adds_backlog_until_released_once() -> None:
    p = _load()
    p.acquire("r1", "e", 400, now=0)
    p.acquire("r2", "e", 100, now=0)
    assert p.backlog("e") == 500
    assert p.release("r1")
    assert not p.release("r1")
    assert p.backlog("e") == 100


def test_elephant_lease_counts_until_released() -> None:
    p = _load()
    p.acquire("big", "e", 5000, now=0)
    assert p.elephants("e") == 1
    p.release("big")
    assert p.elephants("e") == 0


def test_uncached_estimate_subtracts_the_callers_last_prompt_on_that_endpoint() -> None:
    p = _load()
    p.remember("c", "e", 900, now=0)
    assert p.uncached("c", "e", 1000, now=1) == 100
    assert p.uncached("c", "other", 1000, now=1) == 1000
    assert p.uncached("someone", "e", 1000, now=1) == 1000
    assert p.uncached("c", "e", 1000, now=61) == 1000  # hint expired


def test_lease_lost_with_its_ingress_expires() -> None:
    p = _load()
    p.acquire("r", "e", 400, now=0)
    p.expire(now=31)
    assert p.backlog("e") == 0
