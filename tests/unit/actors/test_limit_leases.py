"""The LimitsActor's running leases (``LeaseBook``) and its budget announcements
(``Counters.budget_crossings``), as functions of an injected time."""

from __future__ import annotations

from datetime import UTC, datetime

from actors.state.limit_counters import Counters, Lease
from actors.state.limit_leases import LeaseBook
from schemas.limits import LimitSpec

T0 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC).timestamp()


def _lease(request_id: str, expires: float) -> Lease:
    return Lease(request_id, "ingress-1", [], 10, 0.0, expires)


def test_lease_book_expires_only_leases_past_their_expiry_and_drops_them() -> None:
    book = LeaseBook()
    book.add(_lease("a", T0 + 10))
    book.add(_lease("b", T0 + 20))
    assert book.expired(T0 + 9) == []
    assert [lease.request_id for lease in book.expired(T0 + 10)] == ["a"]
    assert len(book) == 1 and book.pop("a") is None


def test_lease_book_renewal_moves_the_expiry_and_says_whether_any_was_held() -> None:
    book = LeaseBook()
    book.add(_lease("a", T0 + 10))
    assert book.renew(["a", "gone"], T0 + 30)
    assert not book.renew(["gone"], T0 + 30)
    assert book.expired(T0 + 10) == []  # renewed since: due later
    assert [lease.request_id for lease in book.expired(T0 + 30)] == ["a"]


def test_lease_book_never_expires_a_popped_lease() -> None:
    book = LeaseBook()
    book.add(_lease("a", T0 + 10))
    popped = book.pop("a")
    assert popped is not None and popped.request_id == "a"
    assert book.expired(T0 + 60) == [] and list(book.leases()) == []


def test_lease_book_expires_a_lease_added_twice_once() -> None:
    # Two ingresses sharing request ids (both pid 1) added one id twice: its two deadlines
    # both found it, and dropping it a second time crashed the actor (KeyError).
    book = LeaseBook()
    book.add(_lease("a", T0 + 10))
    book.add(_lease("a", T0 + 10))

    assert [lease.request_id for lease in book.expired(T0 + 10)] == ["a"]
    assert len(book) == 0 and book.expired(T0 + 60) == []


def test_budget_crossings_announce_the_soft_threshold_then_the_budget_once_per_period() -> None:
    spec = LimitSpec(budget_usd=10.0, budget_period="day", soft_fraction=0.5)
    c = Counters()
    assert c.budget_crossings(spec, T0) == []
    c.spent_usd = 6.0
    assert c.budget_crossings(spec, T0) == [False]
    assert c.budget_crossings(spec, T0) == []  # announced already this period
    c.spent_usd = 10.0
    assert c.budget_crossings(spec, T0) == [True]
    assert c.budget_crossings(LimitSpec(rpm=5), T0) == []  # no budget, nothing to cross
