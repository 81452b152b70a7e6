"""The simulated upstream: one ``Adapter`` answering as the providers file says, on the loop's
(virtual) time.

Per route it keeps what a real provider keeps: requests in flight against its capacity (the
rest wait in a FIFO queue, so their TTFT grows with it), its rate limit (``rate_meter``:
beyond it a 429 with ``Retry-After`` and ``x-ratelimit-*`` headers, through the same
``error_from_status`` as a real HTTP answer), per credential a quota plan's use in its
period (spent: 429 ``insufficient_quota``) and the attempts in flight against a concurrency
plan (one more: 429 at once), the keys it refuses (403), outage windows, drift and random
failures.
Every random draw comes from one ``random.Random`` per route seeded from the replay's seed,
so a replay is repeatable. What it bills (tokens per route) is kept in ``billed``, and what
the gateway's background probes cost (``for_probes()``, the same routes) in ``probes``.
"""

from __future__ import annotations

import asyncio
import copy
import functools
import math
from collections import deque
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from random import Random
from typing import TYPE_CHECKING, Any

import msgspec

from gateway.adapters.base import JSON, Batch, UpstreamTarget, bad_response
from gateway.replay.answers import (
    arguments_delta,
    asked_tokens_of,
    called_tool,
    failure,
    output_tokens_of,
    prompt_tokens_of,
    quota_spent,
    refused,
    text_delta,
    too_many,
    tool_arguments,
    usage,
)
from gateway.replay.rate_meter import RateMeter
from schemas import UpstreamError
from schemas.canonical_markers import RATE_REPORT
from schemas.route_config import ANTHROPIC_DEFAULT_MAX_TOKENS

if TYPE_CHECKING:
    from collections.abc import AsyncIterator, Callable

    from gateway.replay.providers import ErrorRates, Provider, ProvidersFile
    from schemas.routing import RateReport

_encode = msgspec.json.Encoder().encode
_STALL_SECONDS = 86_400.0
_READ_SECONDS = 5.0


@dataclass(slots=True)
class Billed:
    """Tokens a route answered (its provider's bill, before prices)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(slots=True)
class _Route:
    """One simulated provider's state."""

    provider: Provider
    rng: Random
    in_flight: int = 0
    queue: deque[asyncio.Future[None]] = field(default_factory=deque)
    meter: RateMeter | None = None  # its rate limit's state, when it has one
    # Per credential: (period index, requests, tokens) of its quota plan; attempts in flight
    # against its concurrency plan.
    quota_used: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    plan_in_flight: dict[str, int] = field(default_factory=dict)


class SimulatedAdapter:
    """An ``Adapter`` for every simulated route. ``now`` is the loop's clock and ``origin``
    the virtual time of the trace's start. Raises UpstreamError as a real adapter would."""

    def __init__(
        self, providers: ProvidersFile, seed: int, now: Callable[[], float], origin: float
    ) -> None:
        self._providers = providers
        self._seed = seed
        self._now = now
        self.origin = origin
        self._routes: dict[str, _Route] = {}
        self.billed: dict[str, Billed] = {}
        self.probes: dict[str, Billed] = {}
        self._ledger = self.billed

    def for_probes(self) -> SimulatedAdapter:
        """The same simulated routes (state, queues, windows, draws) billing to ``probes``:
        the adapter the background probers get."""
        view = copy.copy(self)
        view._ledger = self.probes
        return view

    def _route(self, target: UpstreamTarget) -> _Route:
        route = self._routes.get(target.endpoint)
        if route is None:
            provider = self._providers.for_route(target.endpoint, target.base_url)
            if provider is None:
                raise UpstreamError(
                    f"the providers file describes no route {target.endpoint}",
                    endpoint=target.endpoint,
                    kind="connect",
                )
            route = _Route(provider, Random(f"{self._seed}:{target.endpoint}"))
            if provider.rate_limit is not None:
                route.meter = RateMeter(provider.rate_limit, target.endpoint)
            self._routes[target.endpoint] = route
        return route

    # -- the Adapter protocol ------------------------------------------------------------

    async def complete(self, target: UpstreamTarget, body: JSON) -> JSON:
        """The whole answer once generated."""
        route, prompt, output, kind, rate, settle = self._admit(target, body)
        async with self._slot(route, target.api_key or "", settle):
            await asyncio.sleep(self._ttft(route, prompt, kind))
            if kind == "empty":
                raise bad_response(target.endpoint, "an empty body")
            await asyncio.sleep((output - 1) / route.provider.output_tps)
        self._bill(target.endpoint, prompt, output)
        tool = called_tool(body)
        message: dict[str, Any] = {"role": "assistant", "content": "x" * output}
        if tool is not None:
            function = {"name": tool, "arguments": tool_arguments(output)}
            call = {"id": "call_sim", "type": "function", "function": function}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
        answer = {
            "id": "chatcmpl-sim",
            "object": "chat.completion",
            "created": 0,
            "model": target.upstream_model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "stop" if tool is None else "tool_calls",
                }
            ],
            "usage": usage(prompt, output),
        }
        if rate is not None:  # what its headers said, as the openai_compat adapter puts it
            answer[RATE_REPORT] = rate
        return answer

    async def stream(self, target: UpstreamTarget, body: JSON) -> AsyncIterator[Batch]:
        """The first token after the TTFT, the rest at the route's output rate (a tool call's
        arguments as a text's content)."""
        route, prompt, output, kind, rate, settle = self._admit(target, body)
        base = {"id": "chatcmpl-sim", "object": "chat.completion.chunk", "created": 0}
        base["model"] = target.upstream_model
        tool = called_tool(body)
        delta = text_delta if tool is None else arguments_delta
        async with self._slot(route, target.api_key or "", settle):
            await asyncio.sleep(self._ttft(route, prompt, kind))
            if kind == "empty":
                return
            first: dict[str, Any] = {"index": 0, "delta": {"role": "assistant", "content": "x"}}
            if tool is not None:
                opening = {"name": tool, "arguments": '{"query": "'}
                call = {"index": 0, "id": "call_sim", "type": "function", "function": opening}
                first = {"index": 0, "delta": {"role": "assistant", "tool_calls": [call]}}
            yield Batch(
                [{**base, "choices": [{**first, "finish_reason": None}]}],
                rate=rate,
            )
            left, tps = output - 1, route.provider.output_tps
            # One read per _READ_SECONDS of generation: idle timeouts see a live stream.
            per_read = max(1, int(tps * _READ_SECONDS))
            while left > per_read:
                await asyncio.sleep(per_read / tps)
                left -= per_read
                piece = {"index": 0, "delta": delta("x" * per_read), "finish_reason": None}
                yield Batch([{**base, "choices": [piece]}])
            await asyncio.sleep(left / tps)
            tail = "x" * left if tool is None else "x" * left + '"}'
            rest = {"index": 0, "delta": delta(tail), "finish_reason": None}
            end = "stop" if tool is None else "tool_calls"
            done = {"index": 0, "delta": {}, "finish_reason": end}
            self._bill(target.endpoint, prompt, output)
            yield Batch(
                [
                    {**base, "choices": [rest]},
                    {**base, "choices": [done]},
                    {**base, "choices": [], "usage": usage(prompt, output)},
                ],
                last=True,
            )

    async def embed(self, target: UpstreamTarget, body: JSON) -> JSON:
        """Embeddings are not simulated: a bad response."""
        raise bad_response(target.endpoint, "the simulator answers chat only")

    # -- behaviour -----------------------------------------------------------------------

    def _admit(
        self, target: UpstreamTarget, body: JSON
    ) -> tuple[_Route, int, int, str | None, RateReport | None, Callable[[], None]]:
        """The route, prompt and output tokens of an attempt the provider accepts, the
        failure it will show once served (``stall``, ``empty``), its request limit's state
        (:meth:`_rate_limit`) and what to call once it ends (a token limit reserves the
        request's ``max_tokens`` while it runs and gets back what its answer did not use, as
        OpenAI and Anthropic meter); raises the UpstreamError of an outage, a rate limit or
        a failure drawn to come at once."""
        route = self._route(target)
        prompt, output = prompt_tokens_of(body), output_tokens_of(body)
        asked = asked_tokens_of(body)
        if asked is None and target.kind == "anthropic":
            asked = ANTHROPIC_DEFAULT_MAX_TOKENS  # what the adapter sends Claude
        reserved = max(output, asked or 0)
        now = self._now()
        p = route.provider
        outage = p.outage_at(now - self.origin)
        rates = p.errors
        if outage is not None and outage.errors is not None:
            rates = outage.errors
        elif outage is not None and outage.kind == "stall":
            return route, prompt, output, "stall", None, _nothing
        elif outage is not None:
            raise failure(target.endpoint, outage.kind)
        credential = target.api_key or ""
        if credential and refused(p.refused_keys, credential):
            raise failure(target.endpoint, "http_403")
        period = self._quota_left(route, target.endpoint, credential, now, prompt + output)
        if p.concurrency is not None and route.plan_in_flight.get(credential, 0) >= (
            p.concurrency.limit
        ):
            raise too_many(target.endpoint, p.concurrency.retry_after)
        rate, settle = None, _nothing
        if route.meter is not None:
            rate = route.meter.take(now, prompt, reserved)
            settle = functools.partial(self._give_back, route.meter, now, reserved - output)
        kind = _draw(route.rng, rates)
        if kind in ("http_500", "http_503", "http_401", "http_403", "reset"):
            settle()
            raise failure(target.endpoint, kind)
        if p.quota is not None:
            _, requests, tokens = route.quota_used.get(credential, (period, 0, 0))
            route.quota_used[credential] = (period, requests + 1, tokens + prompt + output)
        if p.concurrency is not None:  # released when its slot is (see _slot)
            route.plan_in_flight[credential] = route.plan_in_flight.get(credential, 0) + 1
        return route, prompt, output, kind, rate, settle

    def _give_back(self, meter: RateMeter, taken_at: float, tokens: int) -> None:
        """``tokens`` of output an attempt admitted at ``taken_at`` reserved come back."""
        meter.give_back(taken_at, tokens, self._now())

    def _quota_left(
        self, route: _Route, endpoint: str, credential: str, now: float, tokens: int
    ) -> int:
        """The current period of the route's quota plan (0 without one); raises the 429
        ``insufficient_quota`` a provider answers once ``credential`` spent it."""
        plan = route.provider.quota
        if plan is None:
            return 0
        period = int((now - self.origin) // plan.period_seconds)
        used_period, requests, used_tokens = route.quota_used.get(credential, (period, 0, 0))
        if used_period != period:
            requests = used_tokens = 0
        if (plan.requests is not None and requests >= plan.requests) or (
            plan.tokens is not None and used_tokens + tokens > plan.tokens
        ):
            raise quota_spent(endpoint)
        return period

    def _ttft(self, route: _Route, prompt: int, kind: str | None) -> float:
        """This attempt's unloaded TTFT: lognormal, drifted, longer for a longer prompt (a
        stall: a day, which the gateway's timeouts cut short)."""
        p = route.provider
        median = p.ttft.median + p.ttft.per_1k_prompt * prompt / 1000.0
        sample = median * math.exp(p.ttft.sigma * route.rng.gauss(0.0, 1.0))
        if kind == "stall":
            return _STALL_SECONDS
        return sample * p.ttft_factor(self._now() - self.origin)

    @asynccontextmanager
    async def _slot(
        self, route: _Route, credential: str, settle: Callable[[], None]
    ) -> AsyncIterator[None]:
        """Hold one of the route's capacity slots, waiting in FIFO order for one; on the way
        out, give back the attempt's place in ``credential``'s concurrency plan and ``settle``
        what it reserved of the token limit (both taken by :meth:`_admit`)."""
        try:
            async with self._capacity(route):
                yield
        finally:
            settle()
            if route.provider.concurrency is not None:
                route.plan_in_flight[credential] -= 1

    @asynccontextmanager
    async def _capacity(self, route: _Route) -> AsyncIterator[None]:
        """Hold one of the route's capacity slots, waiting in FIFO order for one."""
        cap = route.provider.capacity
        if cap is not None and (route.in_flight >= cap or route.queue):
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            route.queue.append(waiter)
            try:
                await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled():
                    route.in_flight -= 1
                    _hand_on(route)  # it was handed a slot it will not use
                elif waiter in route.queue:  # not yet passed over by _hand_on
                    route.queue.remove(waiter)
                raise
        else:
            route.in_flight += 1
        try:
            yield
        finally:
            route.in_flight -= 1
            _hand_on(route)

    def _bill(self, endpoint: str, prompt: int, output: int) -> None:
        billed = self._ledger.setdefault(endpoint, Billed())
        billed.prompt_tokens += prompt
        billed.completion_tokens += output


def _nothing() -> None:
    """Nothing to give back."""


def _hand_on(route: _Route) -> None:
    """Give a free slot to the first waiter still waiting."""
    while route.queue:
        waiter = route.queue.popleft()
        if not waiter.done():
            route.in_flight += 1
            waiter.set_result(None)
            return


def _draw(rng: Random, rates: ErrorRates) -> str | None:
    """One failure kind drawn from ``rates`` (None: no failure)."""
    x = rng.random()
    for kind, p in rates:
        if x < p:
            return str(kind)
        x -= p
    return None
