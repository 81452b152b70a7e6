"""Route pricing and resource declarations: priced once, refused when they do not fit."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from schemas.capacity import CapacityState, pool_of
from schemas.config import LocalQuotaSource, RouteConfig
from schemas.pricing import Pricing, cost_usd, uncached_cost


def test_cost_bills_cached_and_written_tokens_at_their_own_prices() -> None:
    pricing = Pricing(prompt=2.0, completion=8.0, input_cache_reads=0.5, input_cache_writes=2.5)
    cost = cost_usd(
        pricing,
        prompt_tokens=1_000_000,
        completion_tokens=500_000,
        cache_read_tokens=400_000,
        cache_write_tokens=100_000,
    )
    # 500k uncached at 2, 400k read at 0.5, 100k written at 2.5, 500k out at 8 (per million)
    assert cost == pytest.approx(1.0 + 0.2 + 0.25 + 4.0)


def test_undeclared_cache_prices_fall_back_to_the_prompt_price() -> None:
    pricing = Pricing(prompt=3.0, completion=0.0)
    assert cost_usd(
        pricing, prompt_tokens=1000, completion_tokens=0, cache_read_tokens=1000
    ) == pytest.approx(0.003)


def test_one_hour_cache_writes_have_their_own_price_else_the_write_price() -> None:
    def cost(pricing: Pricing) -> float:
        return cost_usd(
            pricing,
            prompt_tokens=3_000_000,
            completion_tokens=0,
            cache_write_tokens=3_000_000,
            cache_write_1h_tokens=2_000_000,
        )

    # Claude's: 5-minute writes at 1.25x the input price, 1-hour ones at 2x.
    assert cost(
        Pricing(prompt=2.0, input_cache_writes=2.5, input_cache_writes_1h=4.0)
    ) == pytest.approx(2.5 + 2 * 4.0)
    # Undeclared: the 5-minute write price, as before the 1-hour one existed.
    assert cost(Pricing(prompt=2.0, input_cache_writes=2.5)) == pytest.approx(3 * 2.5)
    assert cost(Pricing(prompt=2.0)) == pytest.approx(3 * 2.0)


def test_unpriced_route_costs_nothing_and_reports_never_go_negative() -> None:
    assert cost_usd(None, prompt_tokens=10, completion_tokens=10) == 0.0
    assert cost_usd(
        Pricing(prompt=1.0), prompt_tokens=10, completion_tokens=-5, cache_read_tokens=50
    ) == pytest.approx(10 / 1e6)


@pytest.mark.parametrize(
    "cache_prices", [{}, {"input_cache_reads": 0.25, "input_cache_writes": 7.5}]
)
def test_an_uncached_attempt_costs_the_whole_sum_to_the_bit(cache_prices: dict[str, float]) -> None:
    pricing = Pricing(prompt=0.3, completion=1.7, **cache_prices)
    for prompt, completion in [(0, 0), (1, 3), (12, 9), (123_457, 4_321), (-5, 7), (9, -2)]:
        whole = (
            max(0, prompt) * pricing.prompt
            + 0 * pricing.cache_read_price
            + 0 * pricing.cache_write_price
            + max(0, completion) * pricing.completion
        ) / 1_000_000.0
        assert uncached_cost(pricing, prompt, completion) == whole
        assert cost_usd(pricing, prompt_tokens=prompt, completion_tokens=completion) == whole


def test_negative_price_is_refused() -> None:
    with pytest.raises(ValidationError):
        Pricing(prompt=-1.0)


def test_quota_route_needs_a_source_and_a_limit() -> None:
    with pytest.raises(ValidationError, match="needs a quota_source"):
        RouteConfig(kind="echo", provider_type="quota", quota={"limit": 5})
    with pytest.raises(ValidationError, match="needs quota"):
        RouteConfig(kind="echo", provider_type="quota", quota_source={"kind": "local"})
    route = RouteConfig(
        kind="echo",
        provider_type="quota",
        quota={"limit": 5},
        quota_source={"kind": "local", "window": 3600},
    )
    assert isinstance(route.quota_source, LocalQuotaSource)
    assert route.quota_source.window == 3600


def test_resource_fields_on_the_wrong_provider_type_are_refused() -> None:
    with pytest.raises(ValidationError, match="belong to a provider_type: quota"):
        RouteConfig(kind="echo", quota={"limit": 3})
    with pytest.raises(ValidationError, match="belong to a provider_type: concurrency"):
        RouteConfig(kind="echo", concurrency={"limit": 3})
    with pytest.raises(ValidationError, match="needs concurrency"):
        RouteConfig(kind="echo", provider_type="concurrency")


def test_mistyped_quota_source_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValidationError, match="'local', 'http_json'"):
        RouteConfig(
            kind="echo", provider_type="quota", quota={"limit": 3}, quota_source={"kind": "locl"}
        )
    with pytest.raises(ValidationError, match="unknown time zone"):
        RouteConfig(
            kind="echo",
            provider_type="quota",
            quota={"limit": 3},
            quota_source={"kind": "local", "timezone": "Mars/Olympus"},
        )
    with pytest.raises(ValidationError, match="http"):
        RouteConfig(
            kind="echo",
            provider_type="quota",
            quota_source={
                "kind": "http_json",
                "url": "ftp://x",
                "used_path": "u",
                "limit_path": "l",
            },
        )


def test_pool_is_the_named_one_or_the_routes_own() -> None:
    shared = RouteConfig(
        kind="echo",
        provider_type="concurrency",
        concurrency={"limit": 2},
        concurrency_pool="team-plan",
    )
    own = RouteConfig(kind="echo", provider_type="concurrency", concurrency={"limit": 2})
    assert pool_of(shared, "m:echo") == "team-plan"
    assert pool_of(own, "m:echo") == "m:echo"
    assert pool_of(RouteConfig(kind="echo"), "m:echo") is None


def test_capacity_state_fractions() -> None:
    state = CapacityState(pool="p", kind="quota", limit=4, used=3)
    assert state.free == 1 and state.used_fraction == pytest.approx(0.75)
    assert CapacityState(pool="p", kind="quota", limit=0, used=0).used_fraction == 1.0
