"""AffinityTable: sliding TTL, drop on error, lazy sweep, snapshot round trip."""

from __future__ import annotations

from typing import TYPE_CHECKING

from actors.state import expiring
from actors.state.affinity import AffinityTable

if TYPE_CHECKING:
    import pytest


def test_pin_within_ttl_is_returned_and_refresh_slides_it() -> None:
    t = AffinityTable(ttl=300)
    t.pin("ip:1.2.3.4", "m:a", now=0)
    assert t.get("ip:1.2.3.4", now=299) == "m:a"
    t.pin("ip:1.2.3.4", "m:a", now=299)
    assert t.get("ip:1.2.3.4", now=598) == "m:a"


def test_pin_after_ttl_without_traffic_expires() -> None:
    t = AffinityTable(ttl=300)
    t.pin("c", "m:a", now=0)
    assert t.get("c", now=300) is None
    assert len(t) == 0


def test_drop_with_other_endpoint_keeps_the_pin() -> None:
    t = AffinityTable(ttl=300)
    t.pin("c", "m:a", now=0)
    assert not t.drop("c", "m:b")
    assert t.drop("c", "m:a")
    assert t.get("c", now=1) is None


def test_table_past_sweep_threshold_sweeps_expired_entries_lazily() -> None:
    t = AffinityTable(ttl=10, sweep_threshold=3)
    for i in range(3):
        t.pin(f"old{i}", "m:a", now=0)
    t.pin("new", "m:a", now=100)  # 4 > threshold: the three expired ones go
    assert len(t) == 1


def test_snapshot_restore_skips_expired_pins() -> None:
    t = AffinityTable(ttl=10)
    t.pin("a", "m:a", now=0)
    t.pin("b", "m:b", now=5)
    fresh = AffinityTable(ttl=10)
    fresh.restore(t.snapshot(now=1), now=12)
    assert fresh.get("a", now=12) is None
    assert fresh.get("b", now=12) == "m:b"


def test_a_caller_moved_off_by_an_error_keeps_it_as_home_until_it_is_back_there() -> None:
    t = AffinityTable(ttl=300)
    t.pin("c", "m:a", now=0)
    assert t.drop("c", "m:a")  # m:a failed
    assert (t.get("c", now=1), t.home("c")) == (None, ("m:a", False))
    t.pin("c", "m:b", now=1)  # the fresh pick
    t.home_benched("c")  # m:a was benched since: the caller goes back once it is over
    assert (t.get("c", now=2), t.home("c")) == ("m:b", ("m:a", True))
    assert t.snapshot(now=2) == {"c": ("m:b", 301)}
    assert t.drop("c", "m:b")  # m:b failed too: home is still the first
    assert t.home("c") == ("m:a", True)
    t.pin("c", "m:a", now=3)  # back home
    assert (t.get("c", now=4), t.home("c")) == ("m:a", ("", False))


class _Counted(AffinityTable):
    """An AffinityTable counting its sweeps."""

    sweeps = 0

    def sweep(self, now: float) -> int:
        self.sweeps += 1
        return super().sweep(now)


def test_a_table_of_many_live_callers_is_not_swept_on_every_pin() -> None:
    # 20,000 callers pinned within the TTL (a busy application's users): a table swept on
    # every pin past its threshold scanned every pin for each routing decision.
    t = _Counted(ttl=300, sweep_threshold=1000)
    for n in range(20_000):
        t.pin(f"key:{n}", "m:a", now=n / 1000)
    assert len(t) == 20_000
    assert t.sweeps <= 5  # at 1,000, 2,000, 4,000, 8,000 and 16,000 pins


def test_a_flood_of_callers_keeps_the_most_recently_pinned_within_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(expiring, "CAP", 500)
    t = AffinityTable(ttl=300, sweep_threshold=100)
    for n in range(5_000):
        t.pin(f"grant:{n}", "m:a", now=0)
        t.pin("key:regular", "m:b", now=0)  # a caller that keeps calling stays pinned
    assert len(t) <= 2 * 500  # swept back to the cap once the table has doubled
    assert t.get("key:regular", now=1) == "m:b"
    assert t.get("grant:4999", now=1) == "m:a"
    assert t.get("grant:0", now=1) is None
