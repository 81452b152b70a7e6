"""KeyPool rules (spec "Reserving upstream keys for a tier"), pure, with an explicit clock."""

from __future__ import annotations

import pytest

from actors.state import expiring
from actors.state.keypool import KeyPool, declaration_of, is_key_specific
from schemas import KeyPoolExhaustedError, KeyPoolRoleRestrictedError
from schemas.config import KeyPoolConfig

S = KeyPoolConfig(
    mute_seconds=300,
    binding_ttl_seconds=300,
    sole_key_tolerance=2,
    sole_key_backoff_seconds=15,
    sole_key_backoff_max_seconds=300,
)


def pool(*keys: tuple[str, str]) -> KeyPool:
    return KeyPool("p", S, keys)


def fail(
    p: KeyPool,
    cid: str,
    now: float,
    status: int | None = 429,
    role: str | None = "free",
    retry_after: float | None = None,
) -> float | None:
    return p.record(
        cid, status=status, outcome="failure", role=role, now=now, retry_after=retry_after
    )


def test_keys_are_used_in_declared_order() -> None:
    p = pool(("a", "free"), ("b", "free"))
    assert p.acquire("c1", "free", 0) == "a"
    assert p.acquire("c2", "pro", 0) == "a"


def test_pool_without_keys_grants_no_credential() -> None:
    assert pool().acquire("c", "free", 0) == ""


@pytest.mark.parametrize("status", [None, 401, 402, 403, 408, 425, 429, 500, 503])
def test_key_specific_failure_mutes_the_key_for_mute_seconds(status: int | None) -> None:
    p = pool(("a", "free"), ("b", "free"))
    assert fail(p, "a", 10, status) == 310
    assert p.acquire("c", "free", 11) == "b"
    assert p.acquire("c2", "free", 310) == "a"  # back on its own


@pytest.mark.parametrize("status", [400, 404, 413, 422])
def test_request_describing_error_does_not_mute(status: int) -> None:
    p = pool(("a", "free"), ("b", "free"))
    assert fail(p, "a", 0, status) is None
    assert p.acquire("c", "free", 1) == "a"


def test_key_specific_statuses() -> None:
    assert [
        s
        for s in (None, 400, 401, 402, 403, 404, 408, 422, 425, 429, 500, 599)
        if is_key_specific(s)
    ] == [None, 401, 402, 403, 408, 425, 429, 500, 599]


def test_a_client_error_with_no_status_never_mutes_a_sole_key() -> None:
    # A model's unusable answer (a 200 with nothing to hand on: empty, a malformed tool
    # call) has no status: it was read as "no answer", so three of one caller's requests
    # muted the route's only key for every caller. A 403 stays the key's.
    p = pool(("a", "free"))
    seen = [
        p.record("a", status=None, outcome="client_error", role="free", now=float(t))
        for t in range(10)
    ]
    assert seen == [None] * 10 and p.acquire("c", "free", 10) == "a"
    forbidden = [
        p.record("a", status=403, outcome="client_error", role="free", now=float(t))
        for t in range(11, 21)
    ]
    assert any(until is not None for until in forbidden)


@pytest.mark.parametrize("kind", ["bad_response", "truncated", "empty_stream", "idle"])
def test_a_failure_after_the_upstream_answered_never_mutes_a_key(kind: str) -> None:
    # A malformed, cut or stalled answer came with the key accepted: read as "no answer",
    # three of them muted a route's only key and every caller got key_pool_exhausted. A
    # failure with no answer at all (a reset) still counts.
    p = pool(("a", "free"))
    seen = [
        p.record("a", status=None, outcome="failure", role="free", now=float(t), kind=kind)
        for t in range(10)
    ]
    assert seen == [None] * 10 and p.acquire("c", "free", 10) == "a"
    assert [fail(p, "a", 11 + t, status=None) for t in range(3)][-1] is not None


def test_a_client_error_with_no_status_leaves_a_failing_keys_streak_alone() -> None:
    # It says nothing of the key either way (an adapter's refusal sent nothing): a sole key
    # failing now and then must not have its streak wiped by other callers' refusals.
    p = pool(("a", "free"))
    assert fail(p, "a", 0, status=None) is None and fail(p, "a", 1, status=None) is None
    p.record("a", status=None, outcome="client_error", role="free", now=2.0)
    assert fail(p, "a", 3, status=None) is not None  # the third failure in a row mutes


def test_retry_after_is_a_floor_and_a_mute_never_shortens() -> None:
    p = pool(("a", "free"), ("b", "free"))
    assert fail(p, "a", 0, retry_after=900) == 900
    assert fail(p, "a", 1, retry_after=1) == 900


SHORT_MUTE = KeyPoolConfig(mute_seconds=60, binding_ttl_seconds=300)


def test_caller_is_bound_for_the_ttl_and_survives_its_key_being_muted() -> None:
    p = KeyPool("p", SHORT_MUTE, [("a", "free"), ("b", "free")])
    fail(p, "a", 0)
    assert p.acquire("c", "free", 1) == "b"  # bound to b
    assert p.acquire("c", "free", 100) == "b"  # a is back at 60; the binding holds
    assert p.acquire("other", "free", 100) == "a"
    fail(p, "b", 101)
    assert p.acquire("c", "free", 102) == "a"  # picks around the muted bound key...
    assert p.bound("c", 102) == ("b", "free")  # ...without losing the binding
    assert p.acquire("c", "free", 161) == "b"
    # The binding slides with use and lapses after a TTL without traffic.
    assert p.bound("c", 161 + 299) is not None
    assert p.acquire("c", "free", 161 + 301) == "a"


def test_binding_is_honoured_only_for_the_role_that_made_it() -> None:
    p = pool(("a", "free"), ("b", "free"))
    fail(p, "a", 0)
    assert p.acquire("c", "free", 1) == "b"
    p.expire(400)
    assert p.acquire("c", "pro", 401) == "a"
    assert p.bound("c", 401) == ("a", "pro")


def test_min_role_hides_a_key_below_that_role_and_most_reserved_go_first() -> None:
    p = pool(("shared", "free"), ("pro1", "pro"), ("int1", "internal"))
    assert p.visible("free") == ("shared",)
    assert p.visible("pro") == ("pro1", "shared")
    assert p.visible("internal") == ("int1", "pro1", "shared")
    assert p.visible(None) == ("int1", "pro1", "shared")  # no identity: unrestricted
    assert p.acquire("f", "free", 0) == "shared"
    assert p.acquire("q", "pro", 0) == "pro1"


def test_all_usable_keys_muted_is_exhausted_with_earliest_unmute() -> None:
    p = pool(("a", "free"), ("b", "free"))
    fail(p, "a", 0)
    fail(p, "b", 10)
    with pytest.raises(KeyPoolExhaustedError) as info:
        p.acquire("c", "free", 20)
    assert type(info.value) is KeyPoolExhaustedError
    assert info.value.counts_against_endpoint
    assert info.value.retry_after == pytest.approx(280)


def test_refusal_only_for_reservation_is_role_restricted_and_not_charged() -> None:
    p = pool(("shared", "free"), ("pro1", "pro"))
    fail(p, "shared", 0, role="pro")
    with pytest.raises(KeyPoolRoleRestrictedError) as info:
        p.acquire("f", "free", 1)
    assert not info.value.counts_against_endpoint
    assert info.value.retry_after == pytest.approx(299)
    only_reserved = pool(("pro1", "pro"))
    with pytest.raises(KeyPoolRoleRestrictedError) as info2:
        only_reserved.acquire("f", "free", 0)
    assert info2.value.retry_after is None
    assert only_reserved.acquire("q", "pro", 0) == "pro1"


def test_sole_key_tolerates_two_failures_then_backs_off_doubling_to_the_max() -> None:
    p = pool(("only", "free"))
    assert fail(p, "only", 0) is None
    assert fail(p, "only", 1) is None
    assert p.acquire("c", "free", 2) == "only"
    assert fail(p, "only", 2) == 17  # 15 s
    assert fail(p, "only", 20) == 50  # 30 s
    assert fail(p, "only", 60) == 120  # 60 s
    for t in (200, 400, 600):
        fail(p, "only", t)
    assert fail(p, "only", 1000) == 1300  # capped at 300 s
    p.record("only", status=200, outcome="success", role="free", now=1400)
    assert fail(p, "only", 1401) is None  # a success resets the streak


def test_sole_key_is_per_caller_role() -> None:
    p = pool(("shared", "free"), ("pro1", "pro"))
    assert fail(p, "shared", 0, role="free") is None  # free's only key: tolerated
    assert fail(p, "shared", 1, role="pro") == 301  # pro has two keys: muted at once


def test_declaration_change_drops_only_bindings_whose_preferred_key_moved() -> None:
    p = KeyPool("p", SHORT_MUTE, [("a", "free"), ("b", "free")])
    fail(p, "a", 0)
    p.acquire("free-caller", "free", 1)  # -> b
    p.acquire("pro-caller", "pro", 1)  # -> b
    # Reserving a new key for pro moves pro's preferred key, not free's.
    dropped = p.declare([("a", "free"), ("b", "free"), ("c", "pro")])
    assert dropped == 1
    assert p.bound("free-caller", 100) == ("b", "free")
    assert p.bound("pro-caller", 100) is None
    assert p.acquire("pro-caller", "pro", 100) == "c"
    # Removing the bound key drops its bindings.
    assert p.declare([("a", "free"), ("c", "pro")]) == 1
    assert p.bound("free-caller", 101) is None
    assert p.declare([("a", "free"), ("c", "pro")]) == 0  # no change, nothing dropped


def test_declaration_change_keeps_mutes_of_kept_keys_and_forgets_removed_ones() -> None:
    p = pool(("a", "free"), ("b", "free"))
    fail(p, "a", 0)
    fail(p, "b", 0)
    p.declare([("a", "pro"), ("c", "free")])
    assert p.mutes(1) == {"a": 300}


def test_unknown_credential_and_cancelled_attempts_are_ignored() -> None:
    p = pool(("a", "free"), ("b", "free"))
    assert fail(p, "zzz", 0) is None
    assert p.record("a", status=None, outcome="cancelled", role="free", now=0) is None
    assert p.mutes(1) == {}


def test_bindings_are_swept_past_the_threshold() -> None:
    p = KeyPool("p", KeyPoolConfig(sweep_threshold=2, binding_ttl_seconds=10), [("a", "free")])
    p.acquire("c1", "free", 0)
    p.acquire("c2", "free", 0)
    p.acquire("c3", "free", 20)
    assert p.bound("c1", 20) is None and p.bound("c3", 20) == ("a", "free")


def test_declaration_of_raises_min_role_to_the_most_restrictive() -> None:
    assert declaration_of([("a", "free"), ("b", "internal")], {"a": "pro", "b": "pro"}) == [
        ("a", "pro"),
        ("b", "internal"),
    ]


def test_probe_lift_never_ends_a_mute_before_the_providers_retry_after() -> None:
    from actors.state.keypool import KeyPool
    from schemas.config import KeyPoolConfig

    pool = KeyPool("p", KeyPoolConfig(mute_seconds=10), [("k1", "free"), ("k2", "free")])
    pool.record("k1", status=429, outcome="failure", role="free", now=0, retry_after=60)
    assert pool.lift("k1", now=5) == 60  # back at the Retry-After, not at the probe
    assert pool.muted_until("k1", 30) == 60
    pool.record("k2", status=500, outcome="failure", role="free", now=0)
    assert pool.lift("k2", now=5) == 5
    assert pool.muted_until("k2", 5) is None
    assert pool.remute("k2", now=6) == 16  # the period it was muted for, again


def spent(p: KeyPool, cid: str, now: float, retry_after: float | None = None) -> float | None:
    return p.record(
        cid,
        status=429,
        outcome="failure",
        role="free",
        now=now,
        retry_after=retry_after,
        quota=True,
    )


def test_a_spent_quota_mute_doubles_while_found_spent_up_to_its_cap_and_a_success_resets() -> None:
    p = KeyPool("p", KeyPoolConfig(mute_seconds=300, quota_mute_max_seconds=1000))
    p.declare([("a", "free"), ("b", "free")])
    assert spent(p, "a", 0) == 300
    assert spent(p, "a", 10) is None  # an answer sent before the mute: no news
    assert p.remute("a", 150) == 750  # its probe found it spent: twice as long
    assert spent(p, "a", 750) == 750 + 1000  # capped
    assert p.record("a", status=200, outcome="success", role="free", now=1750) is None
    assert spent(p, "a", 2000) == 2300  # short again after a success


def test_a_spent_quota_mutes_until_the_providers_reset_when_later_and_a_probe_success_resets() -> (
    None
):
    p = KeyPool("p", KeyPoolConfig(mute_seconds=300))
    p.declare([("a", "free"), ("b", "free")])
    assert spent(p, "a", 0, retry_after=7200) == 7200
    assert p.lift("a", 100) == 7200  # never before the provider's reset
    assert spent(p, "a", 8000) == 8300  # the probe's success reset the doubling


def test_a_sole_key_with_a_spent_quota_is_muted_at_once() -> None:
    p = pool(("a", "free"))
    assert spent(p, "a", 0) == 300  # no tolerance: a spent quota is not a hiccup


def test_spares_are_the_other_usable_keys_in_order_bounded() -> None:
    p = pool(("a", "free"), ("b", "free"), ("c", "free"), ("d", "free"))
    fail(p, "c", 0, 401)
    assert p.spares("a", "free", 1, 5) == ("b", "d")
    assert p.spares("a", "free", 1, 1) == ("b",)
    assert pool(("a", "free")).spares("a", "free", 0, 5) == ()


def test_quiet_only_while_no_mute_or_cooling_set_by_any_path_is_running() -> None:
    """The selection's fast path (no key muted or cooling: every visible key usable) holds
    only while every mute and cooling end, however it was set, lies in the past."""
    p = pool(("a", "free"), ("b", "free"))
    assert p._quiet(0) and p.usable("free", 0) == ["a", "b"]
    assert p.cooling_until("free", 0) is None

    fail(p, "a", 10, status=500)  # a key-specific failure: muted for mute_seconds
    assert not p._quiet(10) and p.usable("free", 10) == ["b"]
    assert p._quiet(310) and p.usable("free", 310) == ["a", "b"]

    p.rate_limited("b", 400, retry_after=30)  # a 429: cooling, not a mute
    assert not p._quiet(400) and p.usable("free", 400) == ["a"]
    p.rate_limited("a", 400, retry_after=30)
    assert p.cooling_until("free", 400) == 430  # every key cooling: the route cools
    assert p._quiet(430) and p.cooling_until("free", 430) is None

    view = pool(("a", "free"), ("b", "free"))  # a model's copy, folding its owner's state
    view.set_mutes({"a": 600.0})
    assert not view._quiet(500) and view.usable("free", 500) == ["b"]
    view.cooling.merge({"b": 700.0})
    assert view.usable("free", 650) == ["a"] and view.usable("free", 700) == ["a", "b"]

    restored = pool(("a", "free"), ("b", "free"))
    assert restored.restore({"b": (900.0, 0.0, 300.0, 0)}, 800) == ["b"]
    assert not restored._quiet(800) and restored.usable("free", 800) == ["a"]
    assert restored.remute("b", 950) == 1250  # found still failing: muted again
    assert restored.usable("free", 1000) == ["a"] and restored._quiet(1250)


def test_a_removed_key_leaves_nothing_behind_for_its_return() -> None:
    # Provider keys come and go (admin deletes, reloads); what a removed key's mutes left
    # (its Retry-After floor, its last mute period) must go with it: kept, they grew with
    # every key ever muted, and a key re-added under its id inherited an hour-long floor.
    p = pool(("a", "free"), ("b", "free"))
    assert fail(p, "a", 0, 401, retry_after=3600) == 3600
    p.declare([("b", "free")])
    p.declare([("a", "free"), ("b", "free")])  # a new secret under the same id
    assert fail(p, "a", 10, 401) == 310
    assert p.lift("a", 20) == 20  # the old key's Retry-After is not this one's
    assert p.mute_period("a") == S.mute_seconds


def test_keys_muted_then_removed_do_not_accumulate() -> None:
    p = pool(("keep", "free"))
    for i in range(1000):
        p.declare([("keep", "free"), (f"k{i}", "free")])
        fail(p, f"k{i}", i, 401, retry_after=5000.0)
    p.declare([("keep", "free")])
    assert all(p.mute_period(f"k{i}") == S.mute_seconds for i in range(1000))


class _Counted(KeyPool):
    """A KeyPool counting its sweeps of bindings."""

    sweeps = 0

    def sweep(self, now: float) -> int:
        self.sweeps += 1
        return super().sweep(now)


def test_a_pool_bound_to_many_live_callers_is_not_swept_on_every_binding() -> None:
    p = _Counted("p", KeyPoolConfig(sweep_threshold=1000), [("a", "free")])
    for n in range(20_000):
        p.acquire(f"key:{n}", "free", n / 1000)
    assert p.sweeps <= 5  # at 1,000, 2,000, 4,000, 8,000 and 16,000 bindings
    assert p.bound("key:0", 20) == ("a", "free")


def test_a_flood_of_callers_keeps_the_most_recent_bindings_within_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(expiring, "CAP", 500)
    p = KeyPool("p", KeyPoolConfig(sweep_threshold=100), [("a", "free")])
    for n in range(5_000):
        p.acquire(f"grant:{n}", "free", 0)
        p.acquire("key:regular", "free", 0)  # a caller that keeps calling stays bound
    assert p.bound("key:regular", 1) == ("a", "free")
    assert p.bound("grant:4999", 1) == ("a", "free")
    assert p.bound("grant:0", 1) is None
