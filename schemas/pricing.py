"""What a route charges and what a request cost: USD per million tokens, priced once here.

``Pricing`` is a route's ``pricing:`` block. ``cost_usd`` prices one attempt's usage with it;
RouteWise uses the same numbers for its effective cost and spend accounting for the bill, so
the two never disagree on what a token costs.
"""

from __future__ import annotations

from pydantic import Field

from schemas.process_config import Strict

PER_MILLION = 1_000_000.0


class Pricing(Strict):
    """USD per million tokens: prompt (uncached input), completion, cache reads and writes.

    ``input_cache_reads`` / ``input_cache_writes`` default to the prompt price: a route that
    declares no cache prices bills cached tokens as ordinary prompt tokens.
    ``input_cache_writes_1h`` prices the cache writes with a 1-hour TTL (Claude's: 2x the
    input price, where 5-minute writes are 1.25x); it defaults to the ``input_cache_writes``
    price, so a route that declares none bills them as it did before it existed.
    """

    prompt: float = Field(default=0.0, ge=0)
    completion: float = Field(default=0.0, ge=0)
    input_cache_reads: float | None = Field(default=None, ge=0)
    input_cache_writes: float | None = Field(default=None, ge=0)
    input_cache_writes_1h: float | None = Field(default=None, ge=0)

    @property
    def cache_read_price(self) -> float:
        """USD per million cache-read tokens (the prompt price when not declared)."""
        return self.prompt if self.input_cache_reads is None else self.input_cache_reads

    @property
    def cache_write_price(self) -> float:
        """USD per million cache-write tokens (the prompt price when not declared)."""
        return self.prompt if self.input_cache_writes is None else self.input_cache_writes

    @property
    def cache_write_1h_price(self) -> float:
        """USD per million 1-hour cache-write tokens (the cache-write price when not
        declared)."""
        w1h = self.input_cache_writes_1h
        return self.cache_write_price if w1h is None else w1h


def cost_usd(
    pricing: Pricing | None,
    *,
    prompt_tokens: int,
    completion_tokens: int,
    cache_read_tokens: int = 0,
    cache_write_tokens: int = 0,
    cache_write_1h_tokens: int = 0,
) -> float:
    """What one attempt cost. ``prompt_tokens`` is the whole input as OpenAI reports it
    (cached tokens included): the cached and cache-written parts are billed at their own
    prices (``cache_write_1h_tokens`` of the writes, those with a 1-hour TTL, at theirs) and
    only the rest at the prompt price. No pricing: 0.0 (the route is free or unpriced)."""
    if pricing is None:
        return 0.0
    if not cache_read_tokens and not cache_write_tokens:
        return uncached_cost(pricing, prompt_tokens, completion_tokens)
    cached = max(0, min(cache_read_tokens, prompt_tokens))
    written = max(0, min(cache_write_tokens, prompt_tokens - cached))
    uncached = max(0, prompt_tokens - cached - written)
    written_1h = max(0, min(cache_write_1h_tokens, written))
    total = (
        uncached * pricing.prompt
        + cached * pricing.cache_read_price
        + (written - written_1h) * pricing.cache_write_price
        + written_1h * pricing.cache_write_1h_price
        + max(0, completion_tokens) * pricing.completion
    )
    return total / PER_MILLION


def uncached_cost(pricing: Pricing, prompt_tokens: int, completion_tokens: int) -> float:
    """What an attempt that read and wrote no cache cost: :func:`cost_usd`'s sum without its
    two zero terms (RouteWise prices every route so, per request)."""
    prompt = prompt_tokens if prompt_tokens > 0 else 0
    completion = completion_tokens if completion_tokens > 0 else 0
    return (prompt * pricing.prompt + completion * pricing.completion) / PER_MILLION
