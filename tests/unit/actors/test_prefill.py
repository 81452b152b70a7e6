"""PrefillLoad: leases, elephants, the caller's last-prompt hint."""

from __future__ import annotations

from actors.state.prefill import HINTS_MAX, PrefillLoad


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


def test_hints_of_callers_gone_expire_without_any_lease() -> None:
    # With routing.prefill.enabled false (or every prompt already cached) no lease is ever
    # taken, yet each success still leaves a hint keyed by its caller's affinity key (an
    # address, a grant header): the hints must expire all the same.
    p = _load()
    for i in range(20_000):
        p.remember(f"ip:10.{i // 65536}.{i // 256 % 256}.{i % 256}", "e", 900, now=i * 0.01)
    assert p.hint_count <= 10_000  # 60 s of hints at 100 callers a second, and no more


def test_hints_stay_within_their_cap_whatever_the_callers() -> None:
    p = PrefillLoad(elephant_tokens=1000, hint_ttl=1e9)
    for i in range(HINTS_MAX + 5000):
        p.remember(f"grant:{i}", "e", 900, now=0)
    assert p.hint_count <= HINTS_MAX
    assert p.uncached(f"grant:{HINTS_MAX + 4999}", "e", 1000, now=1) == 100  # newest kept
